# Part of vworkspace-operator. License LGPL-3.
"""Every golden file of crates/protocol/tests/golden/ replayed against the model methods (and
error_unauthorized.json over HTTP, test_http); the last test checks each one was compared."""
import copy

from odoo.tests import BaseCase, tagged

from odoo.addons.vworkspace.exceptions import (
    ClusterMismatch,
    ClusterNotRegistered,
    InvalidParams,
    ProtocolVersionMismatch,
)

from .common import COMPARED, RFC3339_Z, VwsCase, golden, golden_names


@tagged('vworkspace', 'at_install')
class TestGolden(VwsCase):

    def test_register(self):
        with self.replaying('register_params.json') as params:
            result = self.register()
            self.assertEqual(self.cluster.bound_uid, params['cluster']['uid'])
            self.assertEqual(self.cluster.agent_instance, params['agent']['instance'])
            self.assertEqual(self.cluster.agent_mode, 'pull')
            self.assertEqual(self.cluster.agent_protocol_version, '1.5')
            self.assertEqual(self.cluster.allowed_namespaces, 'team-a, team-b')
            self.assertEqual(self.cluster.capabilities, 'conflict_report, deletions')
            self.assertEqual(str(self.cluster.agent_started_at), '2026-11-21 10:00:00')
            self.assertTrue(self.cluster.last_seen)
        self.assertEqual(result['cluster_id'], self.cluster.id)
        self.assertGoldenAnswer(result, 'register_result.json', cluster_id=self.cluster.id)

    def test_sync_resync_at_rest(self):
        self.register()
        with self.replaying('sync_params_resync.json') as params:
            result = self.sync(**params)
            reports = self.Report.search([('cluster_id', '=', self.cluster.id)])
            self.assertEqual(sorted(reports.mapped('name')), ['wiki', 'wiki-reindex-7'])
            wiki = reports.filtered(lambda r: r.name == 'wiki')
            self.assertEqual(wiki.state, 'ready')
            self.assertEqual(wiki.ready_reason, 'UpgradeSucceeded')
            self.assertEqual(wiki.deployed_chart_version, '1.2.3')
            self.assertEqual(self.cluster.resyncs_completed, 1)
            self.assertEqual(self.cluster.resync_id, 'agent-7d9f8b6c5-x2x9q-1')
        # Revision 0: no document yet; the answer at rest is the golden one.
        self.assertGoldenAnswer(result, 'sync_result_up_to_date.json')

    def _replay_document(self, name, version):
        expected = golden(name)
        self.register(version)
        self.load_document(expected['desired'])
        result = self.sync()  # no known: the agent never processed a document
        self.assertGoldenAnswer(result, name)
        # The same cursor as known: nothing to send.
        known = {'epoch': expected['desired']['epoch'], 'revision': expected['desired']['revision']}
        again = self.sync(known=known)
        self.assertNotIn('desired', again)
        return result

    def test_document(self):
        self._replay_document('sync_result_document.json', '1.5')

    def test_document_backup_schedule(self):
        self._replay_document('sync_result_document_backup_schedule.json', '1.1')
        app = self.App.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual(app.backup_cron, '0 2 * * *')
        self.assertEqual(app.backup_keep_last, 7)
        self.assertFalse(app.spec_extra_json, "every field of this spec has a field on the form")

    def test_document_maintenance_windows(self):
        self._replay_document('sync_result_document_maintenance_windows.json', '1.2')

    def test_document_verified_restore(self):
        self._replay_document('sync_result_document_verified_restore.json', '1.3')
        op = self.Op.search([('cluster_id', '=', self.cluster.id)])
        self.assertTrue(op.restore_verify)
        self.assertEqual(op.min_protocol_version, '1.3')

    def test_document_helm_tests(self):
        self._replay_document('sync_result_document_helm_tests.json', '1.5')
        app = self.App.search([('cluster_id', '=', self.cluster.id)])
        self.assertTrue(app.test_enable)
        self.assertEqual(app.test_timeout, '2m')

    def test_acks_and_deltas(self):
        self.register()
        self.load_document(golden('sync_result_document.json')['desired'])
        # Revision 13 declares an application in kube-system (refused by the agent's allow-list).
        self.App.create({'cluster_id': self.cluster.id, 'namespace': 'kube-system', 'name': 'miner',
                         'chart_name': 'miner', 'chart_repository_url': 'https://charts.example.com'})
        self.assertEqual(self.cluster.revision, 13)
        with self.replaying('sync_params_delta.json') as params:
            result = self.sync(**params)
            self.assertNotIn('desired', result, "known is the current cursor")
            acks = self.Ack.search([('cluster_id', '=', self.cluster.id)])
            self.assertEqual(sorted(acks.mapped('revision')), [12, 13])
            wiki = self.App.search([('cluster_id', '=', self.cluster.id), ('name', '=', 'wiki')])
            self.assertEqual((wiki.ack_outcome, wiki.ack_reason, wiki.ack_generation),
                             ('conflict', 'OwnedByOperation', 3))
            miner = self.App.search([('name', '=', 'miner')])
            self.assertEqual(miner.status, 'refused')
            self.assertIn('NamespaceNotAllowed', miner.status_message)
            op = self.Op.search([('cluster_id', '=', self.cluster.id)])
            self.assertEqual(op.ack_outcome, 'applied')
            self.assertEqual(op.status, 'running')
            self.assertEqual(op.phase, 'Running')
            deletion = self.Deletion.search([('cluster_id', '=', self.cluster.id)])
            self.assertEqual(deletion.status, 'deleted')
            self.assertEqual(self.cluster.last_error_reason, 'Timeout')
            self.assertEqual(self.cluster.last_error_attempts, 3)
            self.assertEqual(str(self.cluster.last_error_since), '2026-11-21 10:05:32')
        # ADR 0004: adopting what is in force changes the intent (a new revision), and the
        # acknowledged Operation and deletion are no longer sent.
        wiki.action_adopt_in_force()
        self.assertEqual(wiki.chart_version, '1.3.0')
        self.assertEqual(self.cluster.revision, 14)
        doc = self.sync(known={'epoch': 'c7-20261120', 'revision': 13})['desired']
        self.assertEqual(doc['revision'], 14)
        self.assertEqual(doc['operations'], [])
        self.assertEqual(doc['deletions'], [])
        spec = next(a['spec'] for a in doc['applications'] if a['name'] == 'wiki')
        self.assertEqual(spec['values'], {'ingress': {'host': 'wiki.example.com'}, 'replicaCount': 3})

    def test_ack_refused_whole(self):
        self.register()
        desired = copy.deepcopy(golden('sync_result_document.json')['desired'])
        desired['revision'] = 14
        self.load_document(desired)
        with self.replaying('document_ack_refused.json') as ack:
            result = self.sync(acks=[ack], known={'epoch': 'c7-20261120', 'revision': 14})
            self.assertNotIn('desired', result)
            stored = self.Ack.search([('cluster_id', '=', self.cluster.id)])
            self.assertEqual((stored.outcome, stored.reason, stored.revision), ('refused', 'InvalidDocument', 14))
            self.assertEqual(stored.message, ack['message'])
            self.assertTrue(self.cluster.intent_acknowledged)
            self.assertEqual(self.cluster.acknowledged_revision, 14)

    def test_ack_undated_operation_expired(self):
        self.register()
        self.Op.create({'cluster_id': self.cluster.id, 'namespace': 'team-a', 'name': 'wiki-restart-db',
                        'application_name': 'wiki', 'op_type': 'Runbook', 'deadline': False,
                        'payload_json': '{"job": {"template": {"spec": {"containers": []}}}}'})
        self.cluster.with_context(vws_internal=True).write({'epoch': 'c7-20261120', 'revision': 15})
        with self.replaying('document_ack_undated_operation_expired.json') as ack:
            self.sync(acks=[ack], known={'epoch': 'c7-20261120', 'revision': 15})
            op = self.Op.search([('name', '=', 'wiki-restart-db')])
            self.assertEqual(op.status, 'refused')
            self.assertEqual(op.ack_reason, 'Expired')
            self.assertIn('no spec.deadline', op.status_message)
            self.assertFalse(op._sent(), "refused: not sent again (retrying the same intent will not help)")

    def test_report_backup_schedule(self):
        self.register('1.1')
        self.load_document(golden('sync_result_document_backup_schedule.json')['desired'])
        with self.replaying('report_application_backup_schedule.json') as report:
            self.sync(reports=[report])
            app = self.App.search([('cluster_id', '=', self.cluster.id)])
            self.assertIn('team-a-wiki-backup-202611250100-5c1d0e9a7b', app.backup_schedule_report)
            self.assertEqual(app.report_state, 'ready')
            self.assertEqual(app.status, 'not_acknowledged', "reported, but no acknowledgement of its revision yet")

    def test_report_verified_restore(self):
        self.register('1.3')
        self.load_document(golden('sync_result_document_verified_restore.json')['desired'])
        with self.replaying('report_operation_verified_restore.json') as report:
            self.sync(reports=[report])
            op = self.Op.search([('cluster_id', '=', self.cluster.id)])
            self.assertEqual(op.report_state, 'succeeded')
            self.assertEqual(op.verification_passed, report['verification']['passed'])
            self.assertIn(report['verification']['scratch_namespace'], op.verification)
            self.assertEqual(op.result, report['result'])

    def test_error_cluster_mismatch(self):
        self.register()
        other = golden('register_params.json')['cluster']
        other = dict(other, uid='11111111-2222-3333-4444-555555555555')
        with self.assertRaises(ClusterMismatch) as cm:
            self.register(cluster=other)
        self.assertGoldenError(cm.exception, 'error_cluster_mismatch.json')
        with self.assertRaises(ClusterMismatch) as cm:
            self.sync(cluster_uid=other['uid'])
        self.assertGoldenError(cm.exception, 'error_cluster_mismatch.json')

    def test_error_not_registered(self):
        with self.assertRaises(ClusterNotRegistered) as cm:
            self.sync()
        self.assertGoldenError(cm.exception, 'error_not_registered.json')

    def test_error_protocol_version_mismatch(self):
        with self.assertRaises(ProtocolVersionMismatch) as cm:
            self.register('2.0')
        self.assertGoldenError(cm.exception, 'error_protocol_version_mismatch.json')
        self.assertFalse(self.cluster.bound_uid)

    def test_error_invalid_params(self):
        self.register()
        base = golden('sync_params_resync.json')['reports'][0]
        reports = [dict(base, name='app-%d' % i, uid='uid-%d' % i) for i in range(350)]
        with self.assertRaises(InvalidParams) as cm:
            self.sync(reports=reports)
        self.assertGoldenError(cm.exception, 'error_invalid_params.json')

    def test_server_time_is_rfc3339(self):
        result = self.register()
        self.assertRegex(result['server_time'], RFC3339_Z)
        self.assertNotRegex(result['server_time'], r'^\d{4}-\d\d-\d\d \d')


@tagged('vworkspace', 'post_install', '-at_install')
class TestEveryGoldenFileCompared(BaseCase):
    """Runs after every other test of the addon: at_install tests run first (odoo/modules/loading.py),
    and odoo/tests/loader.py's make_suite orders the post_install suite by ``test_sequence``
    (default 0), so test_http's comparison of error_unauthorized.json ran before it."""

    test_sequence = 1000

    def test_every_golden_file_was_compared(self):
        missing = [name for name in golden_names() if not COMPARED.get(name)]
        self.assertFalse(missing, "golden files no test compared with what the addon answers or made of them: %s "
                         "(compared: %s)" % (missing, sorted(COMPARED)))
