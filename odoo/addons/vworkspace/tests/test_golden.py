# Part of vworkspace-operator. License LGPL-3.
"""Every golden file of crates/protocol/tests/golden/ replayed against the model methods."""
import copy

from odoo.tests import tagged

from odoo.addons.vworkspace.exceptions import (
    ClusterMismatch,
    ClusterNotRegistered,
    InvalidParams,
    ProtocolVersionMismatch,
)

from .common import RFC3339_Z, VwsCase, golden, golden_names

REPLAYED = set()


def replays(*names):
    REPLAYED.update(names)
    return lambda f: f


@tagged('vworkspace', 'at_install')
class TestGolden(VwsCase):

    @replays('register_params.json', 'register_result.json')
    def test_register(self):
        result = self.register()
        expected = golden('register_result.json')
        self.assertEqual(result['cluster_id'], self.cluster.id)
        expected['cluster_id'] = self.cluster.id
        self.assertAnswer(result, expected)
        params = golden('register_params.json')
        self.assertEqual(self.cluster.bound_uid, params['cluster']['uid'])
        self.assertEqual(self.cluster.agent_instance, params['agent']['instance'])
        self.assertEqual(self.cluster.agent_mode, 'pull')
        self.assertEqual(self.cluster.agent_protocol_version, '1.5')
        self.assertEqual(self.cluster.allowed_namespaces, 'team-a, team-b')
        self.assertEqual(self.cluster.capabilities, 'conflict_report, deletions')
        self.assertEqual(str(self.cluster.agent_started_at), '2026-11-21 10:00:00')
        self.assertTrue(self.cluster.last_seen)

    @replays('sync_params_resync.json', 'sync_result_up_to_date.json')
    def test_sync_resync_at_rest(self):
        self.register()
        params = golden('sync_params_resync.json')
        result = self.sync(**params)
        # Revision 0: no document yet; the answer at rest is the golden one.
        self.assertAnswer(result, golden('sync_result_up_to_date.json'))
        reports = self.Report.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual(sorted(reports.mapped('name')), ['wiki', 'wiki-reindex-7'])
        wiki = reports.filtered(lambda r: r.name == 'wiki')
        self.assertEqual(wiki.state, 'ready')
        self.assertEqual(wiki.ready_reason, 'UpgradeSucceeded')
        self.assertEqual(wiki.deployed_chart_version, '1.2.3')
        self.assertEqual(self.cluster.resyncs_completed, 1)
        self.assertEqual(self.cluster.resync_id, 'agent-7d9f8b6c5-x2x9q-1')

    def _replay_document(self, name, version):
        expected = golden(name)
        self.register(version)
        self.load_document(expected['desired'])
        result = self.sync()  # no known: the agent never processed a document
        self.assertAnswer(result, expected)
        # The same cursor as known: nothing to send.
        known = {'epoch': expected['desired']['epoch'], 'revision': expected['desired']['revision']}
        again = self.sync(known=known)
        self.assertNotIn('desired', again)
        return result

    @replays('sync_result_document.json')
    def test_document(self):
        self._replay_document('sync_result_document.json', '1.5')

    @replays('sync_result_document_backup_schedule.json')
    def test_document_backup_schedule(self):
        self._replay_document('sync_result_document_backup_schedule.json', '1.1')
        app = self.App.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual(app.backup_cron, '0 2 * * *')
        self.assertEqual(app.backup_keep_last, 7)
        self.assertFalse(app.spec_extra_json, "every field of this spec has a field on the form")

    @replays('sync_result_document_maintenance_windows.json')
    def test_document_maintenance_windows(self):
        self._replay_document('sync_result_document_maintenance_windows.json', '1.2')

    @replays('sync_result_document_verified_restore.json')
    def test_document_verified_restore(self):
        self._replay_document('sync_result_document_verified_restore.json', '1.3')
        op = self.Op.search([('cluster_id', '=', self.cluster.id)])
        self.assertTrue(op.restore_verify)
        self.assertEqual(op.min_protocol_version, '1.3')

    @replays('sync_result_document_helm_tests.json')
    def test_document_helm_tests(self):
        self._replay_document('sync_result_document_helm_tests.json', '1.5')
        app = self.App.search([('cluster_id', '=', self.cluster.id)])
        self.assertTrue(app.test_enable)
        self.assertEqual(app.test_timeout, '2m')

    @replays('sync_params_delta.json')
    def test_acks_and_deltas(self):
        self.register()
        self.load_document(golden('sync_result_document.json')['desired'])
        # Revision 13 declares an application in kube-system (refused by the agent's allow-list).
        self.App.create({'cluster_id': self.cluster.id, 'namespace': 'kube-system', 'name': 'miner',
                         'chart_name': 'miner', 'chart_repository_url': 'https://charts.example.com'})
        self.assertEqual(self.cluster.revision, 13)
        params = golden('sync_params_delta.json')
        result = self.sync(**params)
        self.assertNotIn('desired', result, "known is the current cursor")
        acks = self.Ack.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual(sorted(acks.mapped('revision')), [12, 13])
        wiki = self.App.search([('cluster_id', '=', self.cluster.id), ('name', '=', 'wiki')])
        self.assertEqual((wiki.ack_outcome, wiki.ack_reason, wiki.ack_generation), ('conflict', 'OwnedByOperation', 3))
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

    @replays('document_ack_refused.json')
    def test_ack_refused_whole(self):
        self.register()
        desired = copy.deepcopy(golden('sync_result_document.json')['desired'])
        desired['revision'] = 14
        self.load_document(desired)
        ack = golden('document_ack_refused.json')
        result = self.sync(acks=[ack], known={'epoch': 'c7-20261120', 'revision': 14})
        self.assertNotIn('desired', result)
        stored = self.Ack.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual((stored.outcome, stored.reason, stored.revision), ('refused', 'InvalidDocument', 14))
        self.assertEqual(stored.message, ack['message'])
        self.assertTrue(self.cluster.intent_acknowledged)
        self.assertEqual(self.cluster.acknowledged_revision, 14)

    @replays('document_ack_undated_operation_expired.json')
    def test_ack_undated_operation_expired(self):
        self.register()
        self.Op.create({'cluster_id': self.cluster.id, 'namespace': 'team-a', 'name': 'wiki-restart-db',
                        'application_name': 'wiki', 'op_type': 'Runbook', 'deadline': False,
                        'payload_json': '{"job": {"template": {"spec": {"containers": []}}}}'})
        self.cluster.with_context(vws_internal=True).write({'epoch': 'c7-20261120', 'revision': 15})
        ack = golden('document_ack_undated_operation_expired.json')
        self.sync(acks=[ack], known={'epoch': 'c7-20261120', 'revision': 15})
        op = self.Op.search([('name', '=', 'wiki-restart-db')])
        self.assertEqual(op.status, 'refused')
        self.assertEqual(op.ack_reason, 'Expired')
        self.assertIn('no spec.deadline', op.status_message)
        self.assertFalse(op._sent(), "refused: not sent again (retrying the same intent will not help)")

    @replays('report_application_backup_schedule.json')
    def test_report_backup_schedule(self):
        self.register('1.1')
        self.load_document(golden('sync_result_document_backup_schedule.json')['desired'])
        self.sync(reports=[golden('report_application_backup_schedule.json')])
        app = self.App.search([('cluster_id', '=', self.cluster.id)])
        self.assertIn('team-a-wiki-backup-202611250100-5c1d0e9a7b', app.backup_schedule_report)
        self.assertEqual(app.report_state, 'ready')
        self.assertEqual(app.status, 'not_acknowledged', "reported, but no acknowledgement of its revision yet")

    @replays('report_operation_verified_restore.json')
    def test_report_verified_restore(self):
        self.register('1.3')
        self.load_document(golden('sync_result_document_verified_restore.json')['desired'])
        report = golden('report_operation_verified_restore.json')
        self.sync(reports=[report])
        op = self.Op.search([('cluster_id', '=', self.cluster.id)])
        self.assertEqual(op.report_state, 'succeeded')
        self.assertEqual(op.verification_passed, report['verification']['passed'])
        self.assertIn(report['verification']['scratch_namespace'], op.verification)
        self.assertEqual(op.result, report['result'])

    @replays('error_cluster_mismatch.json')
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

    @replays('error_not_registered.json')
    def test_error_not_registered(self):
        with self.assertRaises(ClusterNotRegistered) as cm:
            self.sync()
        self.assertGoldenError(cm.exception, 'error_not_registered.json')

    @replays('error_protocol_version_mismatch.json')
    def test_error_protocol_version_mismatch(self):
        with self.assertRaises(ProtocolVersionMismatch) as cm:
            self.register('2.0')
        self.assertGoldenError(cm.exception, 'error_protocol_version_mismatch.json')
        self.assertFalse(self.cluster.bound_uid)

    @replays('error_invalid_params.json')
    def test_error_invalid_params(self):
        self.register()
        base = golden('sync_params_resync.json')['reports'][0]
        reports = [dict(base, name='app-%d' % i, uid='uid-%d' % i) for i in range(350)]
        with self.assertRaises(InvalidParams) as cm:
            self.sync(reports=reports)
        self.assertGoldenError(cm.exception, 'error_invalid_params.json')

    @replays('error_unauthorized.json')
    def test_error_unauthorized_is_http(self):
        """Odoo answers a bad key itself, before any method runs: see test_http."""

    def test_zz_every_golden_file_is_replayed(self):
        missing = set(golden_names()) - REPLAYED
        self.assertFalse(missing, "golden files no test replays: %s" % sorted(missing))

    def test_server_time_is_rfc3339(self):
        result = self.register()
        self.assertRegex(result['server_time'], RFC3339_Z)
        self.assertNotRegex(result['server_time'], r'^\d{4}-\d\d-\d\d \d')
