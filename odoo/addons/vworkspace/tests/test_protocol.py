# Part of vworkspace-operator. License LGPL-3.
"""The rules of protocol.md beyond the golden files."""
import copy
import json
from datetime import timedelta

from psycopg2 import IntegrityError

from odoo import fields
from odoo.exceptions import AccessError, UserError, ValidationError
from odoo.tests import Form, tagged
from odoo.tools import mute_logger

from odoo.addons.vworkspace.exceptions import ClusterMismatch, InvalidParams, ProtocolVersionMismatch

from .common import VwsCase, golden

UID = golden('register_params.json')['cluster']['uid']


def app_report(name='wiki', uid='u-1', rv='10', state='ready', **extra):
    report = copy.deepcopy(golden('sync_params_resync.json')['reports'][0])
    report.update(name=name, uid=uid, resource_version=rv, state=state, **extra)
    return report


@tagged('vworkspace', 'at_install')
class TestProtocol(VwsCase):

    def setUp(self):
        super().setUp()
        self.register()

    def new_app(self, name='wiki', cluster=None, **vals):
        return self.App.create(dict({'cluster_id': (cluster or self.cluster).id, 'namespace': 'team-a',
                                     'name': name, 'chart_name': name,
                                     'chart_repository_url': 'https://charts.example.com'}, **vals))

    # -- parameters and versions ------------------------------------------------------------

    def test_unknown_parameter_is_a_version_error(self):
        with self.assertRaises(ProtocolVersionMismatch) as cm:
            self.sync(compression='zstd')
        self.assertIn('compression', str(cm.exception))
        with self.assertRaises(ProtocolVersionMismatch):
            self.register(priority=1)

    def test_other_minor_is_compatible(self):
        self.assertEqual(self.register('1.0')['protocol_version'], '1.5')
        self.assertEqual(self.register('1.9')['protocol_version'], '1.5')
        with self.assertRaises(InvalidParams):
            self.register('one')

    def test_unknown_members_and_values_are_kept_as_text(self):
        report = app_report(state='hibernating', future_field={'x': 1})
        report['conditions'][0]['future_member'] = True
        self.sync(reports=[report], acks=[{'epoch': self.cluster.epoch, 'revision': 1, 'outcome': 'partially',
                                           'objects': [], 'new_member': 1}])
        stored = self.Report.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual(stored.state, 'hibernating')
        self.assertIn('future_field', stored.raw)
        self.assertEqual(self.Ack.search([('cluster_id', '=', self.cluster.id)]).outcome, 'partially')

    def test_bad_parameters_are_invalid_params(self):
        for bad in ({'reports': [{'kind': 'Operation'}]}, {'known': {'epoch': 'x', 'revision': 'eight'}},
                    {'acks': ['applied']}, {'resync': {'id': 'r', 'batch': -1, 'last_batch': True}},
                    {'more': 'yes'}):
            with self.assertRaises(InvalidParams, msg=bad):
                self.sync(**bad)

    # -- revisions and documents --------------------------------------------------------

    def test_revision_bumps_with_intent_only(self):
        self.assertEqual(self.cluster.revision, 0)
        self.assertNotIn('desired', self.sync(), "revision 0 names no document")
        app = self.new_app()
        self.assertEqual((self.cluster.revision, app.changed_revision), (1, 1))
        doc = self.sync(known=None)['desired']
        self.assertEqual((doc['epoch'], doc['revision']), (self.cluster.epoch, 1))
        self.assertEqual([a['name'] for a in doc['applications']], ['wiki'])
        app.chart_version = '1.2.4'
        self.assertEqual((self.cluster.revision, app.changed_revision), (2, 2))
        # Status arriving changes no intent.
        self.sync(reports=[app_report()], known={'epoch': self.cluster.epoch, 'revision': 2})
        self.assertEqual(self.cluster.revision, 2)
        self.assertNotIn('desired', self.sync(known={'epoch': self.cluster.epoch, 'revision': 2}))
        with self.assertRaises(UserError):
            self.cluster.write({'revision': 7})
        with self.assertRaises(UserError):
            app.write({'changed_revision': 1})

    def test_epoch_is_new_per_cluster_and_valid(self):
        other = self.Cluster.create({'name': 'edge-lyon-2'})
        self.assertNotEqual(other.epoch, self.cluster.epoch)
        self.assertRegex(other.epoch, r'^[A-Za-z0-9._-]{1,64}$')

    def test_restored_database_starts_a_new_epoch(self):
        self.new_app()
        epoch = self.cluster.epoch
        # The agent knows revision 9 of this epoch, Odoo only 1: Odoo's counter went back.
        result = self.sync(known={'epoch': epoch, 'revision': 9})
        doc = result['desired']
        self.assertNotEqual(doc['epoch'], epoch)
        self.assertGreater(doc['revision'], 9)
        self.assertTrue(result['resync_requested'])
        self.assertIn(epoch, self.cluster.past_epochs)
        # An epoch Odoo never had: the same.
        result = self.sync(known={'epoch': 'unknown-epoch', 'revision': 1})
        self.assertNotEqual(result['desired']['epoch'], doc['epoch'])
        # A past epoch of Odoo's own is no restore: the agent just did not take the new one yet.
        current = self.cluster.epoch
        self.sync(known={'epoch': doc['epoch'], 'revision': doc['revision']})
        self.assertEqual(self.cluster.epoch, current)

    def test_deletion_by_explicit_intent_with_last_uid(self):
        app = self.new_app()
        self.sync(reports=[app_report(uid='uid-wiki-1')])
        app.action_delete_on_cluster()
        self.assertFalse(app.active)
        doc = self.sync()['desired']
        self.assertEqual(doc['applications'], [])
        self.assertEqual(len(doc['deletions']), 1)
        self.assertEqual(doc['deletions'][0]['uid'], 'uid-wiki-1')
        self.assertEqual(doc['deletions'][0]['kind'], 'ApplicationInstance')
        # Desiring it again drops the deletion: never both desired and deleted.
        self.new_app()
        doc = self.sync()['desired']
        self.assertEqual([a['name'] for a in doc['applications']], ['wiki'])
        self.assertEqual(doc['deletions'], [])

    def test_dropping_an_application_deletes_nothing(self):
        app = self.new_app()
        app.unlink()
        doc = self.sync()['desired']
        self.assertEqual((doc['applications'], doc['deletions']), ([], []))

    def test_operation_sent_until_acknowledged_and_immutable(self):
        op = self.Op.create({'cluster_id': self.cluster.id, 'namespace': 'team-a', 'application_name': 'wiki',
                             'op_type': 'Backup'})
        self.assertTrue(op.request_id.startswith('odoo-op-'))
        self.assertTrue(op.deadline, "a deadline by default")
        self.assertTrue(op.name.startswith('wiki-backup-'))
        doc = self.sync()['desired']
        self.assertEqual(doc['operations'][0]['spec']['requestId'], op.request_id)
        self.assertRegex(doc['operations'][0]['spec']['deadline'], r'Z$')
        ack = {'epoch': doc['epoch'], 'revision': doc['revision'], 'outcome': 'applied',
               'processed_at': '2026-11-21T10:05:31.123456789Z',
               'objects': [{'kind': 'Operation', 'namespace': 'team-a', 'name': op.name, 'outcome': 'applied',
                            'uid': 'op-uid', 'generation': 1}]}
        self.sync(acks=[ack], known={'epoch': doc['epoch'], 'revision': doc['revision']})
        self.assertEqual(op.ack_outcome, 'applied')
        with self.assertRaises(UserError):
            op.urgent = True
        self.new_app()
        doc = self.sync(known={'epoch': doc['epoch'], 'revision': doc['revision']})['desired']
        self.assertEqual(doc['operations'], [], "acknowledged: no longer sent")
        # 'Verify this backup': a Restore with verify, from this Backup.
        op.action_verify_backup()
        restore = self.Op.search([('op_type', '=', 'Restore')])
        self.assertEqual(restore._spec()['restore'],
                         {'source': {'operationName': op.name}, 'verify': True})

    def test_operation_checks(self):
        now = fields.Datetime.now()
        with self.assertRaises(ValidationError):
            self.Op.create({'cluster_id': self.cluster.id, 'namespace': 'team-a', 'application_name': 'wiki',
                            'op_type': 'Backup', 'not_before': now, 'deadline': now})
        with self.assertRaises(ValidationError):
            self.Op.create({'cluster_id': self.cluster.id, 'namespace': 'team-a', 'application_name': 'wiki',
                            'op_type': 'Backup', 'request_id': 'bad id'})
        with self.assertRaises(ValidationError):
            self.new_app(name='Not_A_Label')

    def test_features_wait_for_the_agent_version(self):
        self.register('1.0')
        app = self.new_app(backup_cron='0 2 * * *', backup_keep_last=3)
        plain = self.new_app(name='blog')
        doc = self.sync()['desired']
        self.assertEqual([a['name'] for a in doc['applications']], ['blog'], "1.1's backupSchedule held back")
        self.assertEqual(app.status, 'held')
        self.assertFalse(plain._held())
        revision = self.cluster.revision
        self.register('1.1')
        self.assertEqual(self.cluster.revision, revision + 1, "what the agent may receive changed")
        doc = self.sync(known={'epoch': doc['epoch'], 'revision': doc['revision']})['desired']
        self.assertEqual(sorted(a['name'] for a in doc['applications']), ['blog', 'wiki'])
        # A verified restore (1.3) is never sent to a 1.2 agent as an ordinary restore.
        self.register('1.2')
        self.Op.create({'cluster_id': self.cluster.id, 'namespace': 'team-a', 'application_name': 'wiki',
                        'op_type': 'Restore', 'restore_verify': True,
                        'payload_json': '{"source": {"operationName": "wiki-backup-1"}}'})
        self.assertEqual(self.sync()['desired']['operations'], [])

    # -- reports, acknowledgements, resyncs ------------------------------------------------

    def test_same_call_twice_changes_nothing(self):
        self.new_app()
        doc = self.sync()['desired']
        ack = {'epoch': doc['epoch'], 'revision': doc['revision'], 'outcome': 'applied',
               'processed_at': '2026-11-21T10:05:31Z',
               'objects': [{'kind': 'ApplicationInstance', 'namespace': 'team-a', 'name': 'wiki',
                            'outcome': 'applied', 'uid': 'u-1', 'generation': 2}]}
        params = dict(acks=[ack], reports=[app_report()], known={'epoch': doc['epoch'], 'revision': doc['revision']})
        self.sync(**copy.deepcopy(params))
        reports, acks = self.Report.search([]), self.Ack.search([])
        snapshot = (reports.read(['raw', 'received_at', 'write_date']), acks.read(['raw', 'received_at']))
        self.sync(**copy.deepcopy(params))
        self.assertEqual((self.Report.search([]), self.Ack.search([])), (reports, acks))
        self.assertEqual((reports.read(['raw', 'received_at', 'write_date']), acks.read(['raw', 'received_at'])),
                         snapshot)
        app = self.App.search([('name', '=', 'wiki')])
        self.assertEqual(app.status, 'ready')
        self.assertEqual(self.cluster.syncs, 3)

    def test_latest_report_per_object(self):
        self.sync(reports=[app_report(rv='20', state='ready')])
        self.sync(reports=[app_report(rv='19', state='progressing')])
        stored = self.Report.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual((stored.state, stored.resource_version), ('ready', '20'), "a late duplicate is ignored")
        self.sync(reports=[app_report(uid='u-2', rv='3', state='progressing')])
        self.assertEqual((stored.uid, stored.state), ('u-2', 'progressing'), "recreated: the last arrived wins")
        self.sync(reports=[app_report(uid='u-2', rv='not-a-number', state='ready')])
        self.assertEqual(stored.state, 'ready', "not comparable: replaced")

    def test_resync_sweeps_what_it_did_not_mention(self):
        self.sync(reports=[app_report('a'), app_report('b'), app_report('c')])
        self.sync(reports=[app_report('a')], resync={'id': 'r1', 'batch': 0, 'last_batch': False}, more=True)
        result = self.sync(reports=[app_report('b')], resync={'id': 'r1', 'batch': 1, 'last_batch': True})
        self.assertFalse(result['resync_requested'])
        states = {r.name: (r.state, r.absent_after_resync) for r in self.Report.search([])}
        self.assertEqual(states, {'a': ('ready', False), 'b': ('ready', False), 'c': ('deleted', True)})

    def test_resync_out_of_order_is_abandoned(self):
        self.sync(reports=[app_report('a'), app_report('b')])
        # Another id without batch 0: abandoned, nothing swept, a new resync asked for.
        result = self.sync(reports=[app_report('a')], resync={'id': 'r2', 'batch': 1, 'last_batch': True})
        self.assertTrue(result['resync_requested'])
        self.assertEqual(set(self.Report.search([]).mapped('state')), {'ready'})
        self.assertTrue(self.sync()['resync_requested'], "asked again until a resync starts")
        # Batch 0 starts afresh (whatever the id, even one seen before)...
        result = self.sync(reports=[app_report('a')], resync={'id': 'r2', 'batch': 0, 'last_batch': False})
        self.assertFalse(result['resync_requested'])
        # ... a gap abandons it...
        result = self.sync(reports=[], resync={'id': 'r2', 'batch': 2, 'last_batch': True})
        self.assertTrue(result['resync_requested'])
        self.assertEqual(set(self.Report.search([]).mapped('state')), {'ready'})
        # ... and a repeat too.
        self.sync(resync={'id': 'r3', 'batch': 0, 'last_batch': False})
        self.sync(resync={'id': 'r3', 'batch': 1, 'last_batch': False})
        self.assertTrue(self.sync(resync={'id': 'r3', 'batch': 1, 'last_batch': True})['resync_requested'])

    def test_report_limit_reaches_the_agent(self):
        self.cluster.max_reports_per_sync = 2
        self.assertEqual(self.sync()['max_reports_per_sync'], 2)
        self.assertEqual(self.register()['max_reports_per_sync'], 2)
        with self.assertRaises(InvalidParams) as cm:
            self.sync(reports=[app_report('a'), app_report('b'), app_report('c')])
        self.assertEqual(str(cm.exception), 'reports: at most 2 reports per call (got 3)')
        with mute_logger('odoo.sql_db'), self.assertRaises(IntegrityError), self.env.cr.savepoint():
            self.cluster.max_reports_per_sync = 0
            self.cluster.flush_recordset()

    def test_status_view(self):
        app = self.new_app()
        self.assertEqual(app.status, 'not_acknowledged')
        doc = self.sync()['desired']
        ack = {'epoch': doc['epoch'], 'revision': doc['revision'], 'outcome': 'applied', 'objects': [
            {'kind': 'ApplicationInstance', 'namespace': 'team-a', 'name': 'wiki', 'outcome': 'applied',
             'uid': 'u-1', 'generation': 3}]}
        self.sync(acks=[ack], reports=[app_report(generation=3, observed_generation=2)])
        self.assertEqual(app.status, 'progressing', "observed_generation below the acknowledged generation")
        self.sync(reports=[app_report(rv='11', generation=3, observed_generation=3)])
        self.assertEqual(app.status, 'ready')
        self.assertTrue(self.cluster.agent_online)
        self.cluster.with_context(vws_internal=True).write({'last_seen': fields.Datetime.now() - timedelta(hours=1)})
        self.assertFalse(self.cluster.agent_online)
        self.assertIn('agent offline', app.status_message)
        self.assertEqual(app.status, 'ready', "the last known state, as of last seen")

    def test_rebinding_is_explicit(self):
        self.cluster.action_unbind()
        self.assertFalse(self.cluster.bound_uid)
        params = golden('register_params.json')
        params['cluster'] = dict(params['cluster'], uid='rebuilt-uid')
        self.agent().agent_register(**params)
        self.assertEqual(self.cluster.bound_uid, 'rebuilt-uid')

    # -- who sees what ----------------------------------------------------------------------

    def test_two_clusters_never_see_each_other(self):
        other = self.Cluster.create({'name': 'edge-lyon-2'})
        self.new_app('wiki')
        self.new_app('secret-app', cluster=other)
        params = golden('register_params.json')
        params['cluster'] = {'uid': 'lyon-uid', 'name': 'edge-lyon-2'}
        self.agent(other).agent_register(**params)
        doc_other = self.sync(record=other, cluster_uid='lyon-uid')['desired']
        self.assertEqual([a['name'] for a in doc_other['applications']], ['secret-app'])
        doc = self.sync()['desired']
        self.assertEqual([a['name'] for a in doc['applications']], ['wiki'])
        # A bot reads its own cluster record only (record rule), and writes nothing.
        bot_env = self.agent()
        self.assertEqual(bot_env.search([]), self.cluster)
        with self.assertRaises(AccessError):
            bot_env.browse(other.id).read(['name'])
        with self.assertRaises(AccessError):
            bot_env.browse(self.cluster.id).write({'name': 'x'})
        with self.assertRaises(AccessError):
            self.env['vworkspace.application'].with_user(self.bot).search([])
        # The key of one cluster cannot sync as the other (the record is found from the key).
        with self.assertRaises(ClusterMismatch):
            self.sync(cluster_uid='lyon-uid')

    def test_a_user_who_is_no_bot_gets_access_error(self):
        user = self.env['res.users'].create({'name': 'Ann', 'login': 'ann-vws',
                                             'group_ids': [(6, 0, [self.env.ref('base.group_user').id])]})
        with self.assertRaises(AccessError):
            self.env['vworkspace.cluster'].with_user(user).agent_sync(
                protocol_version='1.5', cluster_uid=UID, agent_instance='x')
        viewer = self.env['res.users'].create({
            'name': 'Vic', 'login': 'vic-vws',
            'group_ids': [(6, 0, [self.env.ref('vworkspace.group_vworkspace_user').id])]})
        with self.assertRaises(AccessError):
            self.env['vworkspace.cluster'].with_user(viewer).agent_sync(
                protocol_version='1.5', cluster_uid=UID, agent_instance='x')

    def test_bot_user_is_minimal(self):
        self.assertTrue(self.bot.share, "not an internal user")
        self.assertEqual(self.bot.group_ids, self.env.ref('vworkspace.group_vworkspace_agent'))

    # -- API keys -------------------------------------------------------------------------

    def test_api_key_generate_rotate_revoke(self):
        Keys = self.env['res.users.apikeys']
        key = self.cluster._generate_api_key()
        self.assertEqual(Keys._check_credentials(scope='rpc', key=key), self.bot.id)
        stored = Keys.sudo().search([('user_id', '=', self.bot.id)])
        self.assertEqual(stored.scope, 'rpc')
        self.assertTrue(stored.expiration_date <= fields.Datetime.now() + timedelta(days=90, minutes=1))
        action = self.cluster.action_rotate_api_key()
        new_key = action['context']['default_key']
        self.assertNotEqual(new_key, key)
        self.assertEqual(Keys._check_credentials(scope='rpc', key=new_key), self.bot.id)
        stored.invalidate_recordset()
        self.assertLessEqual(stored.expiration_date, fields.Datetime.now() + timedelta(minutes=61),
                             "the old key expires after the grace period")
        self.assertEqual(Keys._check_credentials(scope='rpc', key=key), self.bot.id, "still valid meanwhile")
        self.cluster.key_rotation_grace_minutes = 0
        self.env.flush_all()
        newest = self.cluster.action_rotate_api_key()['context']['default_key']
        self.assertFalse(Keys._check_credentials(scope='rpc', key=new_key), "revoked at once")
        self.cluster.action_revoke_api_keys()
        self.env.flush_all()
        self.assertFalse(Keys._check_credentials(scope='rpc', key=newest))
        # Archiving the cluster archives its bot: its keys stop working.
        key = self.cluster._generate_api_key()
        self.cluster.active = False
        self.env.flush_all()  # _check_credentials is SQL
        self.assertFalse(Keys._check_credentials(scope='rpc', key=key))
        self.assertNotIn(key, json.dumps(self.cluster.read(['api_keys'])), "a key is shown once, never stored clear")

    def test_only_managers_make_keys(self):
        viewer = self.env['res.users'].create({
            'name': 'Vic', 'login': 'vic2-vws',
            'group_ids': [(6, 0, [self.env.ref('vworkspace.group_vworkspace_user').id])]})
        with self.assertRaises(AccessError):
            self.cluster.with_user(viewer)._generate_api_key()


@tagged('vworkspace', 'at_install')
class TestViews(VwsCase):

    def test_views_load_for_a_user(self):
        user = self.env['res.users'].create({
            'name': 'Uma', 'login': 'uma-vws',
            'group_ids': [(6, 0, [self.env.ref('vworkspace.group_vworkspace_user').id])]})
        for model, kinds in (('vworkspace.cluster', ('list', 'form', 'kanban', 'search')),
                             ('vworkspace.application', ('list', 'form', 'kanban', 'search')),
                             ('vworkspace.operation', ('list', 'form', 'kanban', 'search')),
                             ('vworkspace.deletion', ('list', 'form')),
                             ('vworkspace.report', ('list', 'form')),
                             ('vworkspace.ack', ('list', 'form'))):
            views = self.env[model].with_user(user).get_views([(False, k) for k in kinds])
            self.assertEqual(set(views['views']), set(kinds), model)

    def test_a_person_declares_an_application_and_an_operation_in_the_form(self):
        user = self.env['res.users'].create({
            'name': 'Uma', 'login': 'uma2-vws',
            'group_ids': [(6, 0, [self.env.ref('vworkspace.group_vworkspace_user').id])]})
        with Form(self.env['vworkspace.application'].with_user(user)) as f:
            f.cluster_id = self.cluster
            f.namespace = 'team-a'
            f.name = 'wiki'
            f.chart_name = 'wiki'
            f.chart_version = '1.2.3'
            f.chart_repository_url = 'https://charts.example.com'
            f.values_json = '{"replicaCount": 2}'
            f.test_enable = True
        app = f.record
        self.assertEqual(app._spec()['test'], {})
        self.assertEqual(app.status, 'not_acknowledged')
        with Form(self.env['vworkspace.operation'].with_user(user)) as f:
            f.cluster_id = self.cluster
            f.namespace = 'team-a'
            f.application_name = 'wiki'
            f.op_type = 'Upgrade'
            f.payload_json = '{"chartVersion": "1.3.0"}'
            f.urgent = True
        self.assertEqual(f.record._spec()['upgrade'], {'chartVersion': '1.3.0'})
        self.assertEqual(self.cluster.revision, 2)

    def test_a_user_requests_a_resync(self):
        user = self.env['res.users'].create({
            'name': 'Uma', 'login': 'uma3-vws',
            'group_ids': [(6, 0, [self.env.ref('vworkspace.group_vworkspace_user').id])]})
        self.register()
        self.cluster.with_user(user).action_request_resync()
        self.assertTrue(self.sync()['resync_requested'])
        with self.assertRaises(AccessError):
            self.cluster.with_user(user).action_new_epoch()
