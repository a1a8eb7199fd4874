# Part of vworkspace-operator. License LGPL-3.
"""The agent's way in: POST /json/2/vworkspace.cluster/<method> with a bearer API key, through
Odoo's real HTTP stack (addons/rpc/controllers/json2.py, odoo/http.py Json2Dispatcher)."""
import json

from odoo.tests import HttpCase, tagged

from .common import RFC3339_Z, assert_golden_error_body, golden

UID = golden('register_params.json')['cluster']['uid']


@tagged('vworkspace', 'post_install', '-at_install')
class TestJson2(HttpCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cluster = cls.env['vworkspace.cluster'].create({'name': 'edge-paris-1'})
        cls.key = cls.cluster._generate_api_key(days=1)
        cls.other = cls.env['vworkspace.cluster'].create({'name': 'edge-lyon-2'})
        cls.other_key = cls.other._generate_api_key(days=1)

    def call(self, method, params, key=None, model='vworkspace.cluster', headers=None):
        h = {
            'Authorization': 'bearer %s' % (key or self.key),
            'Content-Type': 'application/json; charset=utf-8',
            'User-Agent': 'vworkspace-agent/0.1.0',
            'X-Odoo-Database': self.env.cr.dbname,
        }
        h.update(headers or {})
        return self.url_open('/json/2/%s/%s' % (model, method), data=json.dumps(params), headers=h,
                             allow_redirects=False)

    def sync_params(self, **extra):
        params = golden('sync_params_resync.json')
        params.update(extra)
        return params

    def test_register_and_sync(self):
        res = self.call('agent_register', golden('register_params.json'))
        self.assertEqual(res.status_code, 200, res.text)
        body = res.json()
        self.assertEqual(set(body), set(golden('register_result.json')))
        self.assertEqual(body['cluster_id'], self.cluster.id)
        self.assertEqual(body['protocol_version'], '1.5')
        self.assertRegex(body['server_time'], RFC3339_Z, "RFC 3339, not json_default's 'YYYY-MM-DD HH:MM:SS'")
        self.assertEqual((body['sync_interval_seconds'], body['max_reports_per_sync']), (30, 200))

        res = self.call('agent_sync', self.sync_params())
        self.assertEqual(res.status_code, 200, res.text)
        body = res.json()
        self.assertEqual(set(body) - {'next_sync_seconds'}, set(golden('sync_result_up_to_date.json')))
        self.assertFalse(body['resync_requested'])

        self.env['vworkspace.application'].create({
            'cluster_id': self.cluster.id, 'namespace': 'team-a', 'name': 'wiki', 'chart_name': 'wiki',
            'chart_version': '1.2.3', 'chart_repository_url': 'https://charts.example.com'})
        self.env['vworkspace.application'].create({
            'cluster_id': self.other.id, 'namespace': 'team-a', 'name': 'not-yours', 'chart_name': 'x',
            'chart_repository_url': 'https://charts.example.com'})
        res = self.call('agent_sync', self.sync_params(reports=[], resync=None, acks=[]))
        self.assertEqual(res.status_code, 200, res.text)
        desired = res.json()['desired']
        self.assertEqual((desired['epoch'], desired['revision']), (self.cluster.epoch, 1))
        self.assertRegex(desired['generated_at'], RFC3339_Z)
        self.assertEqual(desired['applications'], [{'namespace': 'team-a', 'name': 'wiki', 'spec': {
            'chart': {'name': 'wiki', 'version': '1.2.3', 'repository': {'url': 'https://charts.example.com'}}}}])
        known = {'epoch': desired['epoch'], 'revision': desired['revision']}
        res = self.call('agent_sync', self.sync_params(reports=[], resync=None, known=known))
        self.assertNotIn('desired', res.json())

    def test_wrong_key_is_401(self):
        res = self.call('agent_register', golden('register_params.json'), key='0' * 40)
        self.assertEqual(res.status_code, 401)
        self.assertIn('bearer', res.headers.get('WWW-Authenticate', '').lower())
        # Odoo answers a bad key itself, before any method runs: only HTTP can compare this one.
        assert_golden_error_body(self, res.json(), 'error_unauthorized.json')

    def test_unknown_keyword_is_the_version_error(self):
        res = self.call('agent_sync', self.sync_params(compression='zstd'))
        self.assertEqual(res.status_code, 422, res.text)
        self.assertEqual(res.json()['name'], 'odoo.addons.vworkspace.exceptions.ProtocolVersionMismatch')
        # A missing one is Odoo's own binding error.
        params = self.sync_params()
        del params['cluster_uid']
        res = self.call('agent_sync', params)
        self.assertEqual(res.status_code, 422, res.text)
        self.assertEqual(res.json()['name'], 'werkzeug.exceptions.UnprocessableEntity')
        res = self.call('agent_register', dict(golden('register_params.json'), protocol_version='2.0'))
        self.assertEqual(res.status_code, 422)
        self.assertEqual(res.json()['message'], golden('error_protocol_version_mismatch.json')['message'])

    def test_documented_error_statuses(self):
        res = self.call('agent_sync', self.sync_params())
        self.assertEqual((res.status_code, res.json()['name']),
                         (404, 'odoo.addons.vworkspace.exceptions.ClusterNotRegistered'))
        self.assertEqual(self.call('agent_register', golden('register_params.json')).status_code, 200)
        res = self.call('agent_sync', self.sync_params(cluster_uid='another-uid'))
        self.assertEqual((res.status_code, res.json()['name']), (403, 'odoo.addons.vworkspace.exceptions.ClusterMismatch'))
        self.assertEqual(res.json()['message'], golden('error_cluster_mismatch.json')['message'])
        many = [dict(golden('sync_params_resync.json')['reports'][0], name='a-%d' % i) for i in range(201)]
        res = self.call('agent_sync', self.sync_params(reports=many, resync=None))
        self.assertEqual((res.status_code, res.json()['name']), (422, 'odoo.addons.vworkspace.exceptions.InvalidParams'))
        res = self.call('agent_nothing', {})
        self.assertEqual(res.status_code, 404)
        res = self.call('agent_sync', self.sync_params(), headers={'Content-Type': 'text/plain'})
        self.assertEqual(res.status_code, 415)

    def test_bot_sees_its_own_cluster_only(self):
        res = self.call('search_read', {'domain': [], 'fields': ['name']})
        self.assertEqual(res.status_code, 200, res.text)
        self.assertEqual([r['name'] for r in res.json()], ['edge-paris-1'])
        res = self.call('write', {'ids': [self.other.id], 'vals': {'name': 'mine'}})
        self.assertEqual((res.status_code, res.json()['name']), (403, 'odoo.exceptions.AccessError'))
        res = self.call('search_read', {'domain': [], 'fields': ['name']}, model='vworkspace.application')
        self.assertEqual(res.status_code, 403)
        # Each key finds its own record: the other cluster's key registers the other record.
        params = golden('register_params.json')
        params['cluster'] = {'uid': 'lyon-uid', 'name': 'edge-lyon-2'}
        res = self.call('agent_register', params, key=self.other_key)
        self.assertEqual(res.json()['cluster_id'], self.other.id)
