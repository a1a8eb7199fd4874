# Part of vworkspace-operator. License LGPL-3.
"""Two concurrent agent_sync calls of one cluster, on two real database connections, each
run as Odoo runs a JSON-2 call (odoo/service/model.py ``retrying``): the cluster row lock
makes the second wait, fail to serialise, be retried, and then find the acknowledgement
already stored. Committed data, cleaned up at the end."""
import secrets
import threading
import time
from unittest.mock import patch

from odoo import SUPERUSER_ID, api
from odoo.modules.registry import DummyRLock, Registry
from odoo.orm.environments import Transaction
from odoo.service.model import retrying
from odoo.sql_db import db_connect
from odoo.tests import TransactionCase, tagged

from odoo.addons.vworkspace.models.cluster import VworkspaceCluster

from .common import golden


@tagged('vworkspace', 'post_install', '-at_install')
class TestConcurrency(TransactionCase):

    def test_two_concurrent_syncs_store_one_acknowledgement(self):
        db = db_connect(self.env.cr.dbname)
        registry = self.registry

        def environment(cr, uid):
            # This registry, without Registry(dbname): its class lock is the test runner's.
            cr.transaction = Transaction(registry)
            return api.Environment(cr, uid, {})

        name = 'concurrency-%s' % secrets.token_hex(3)
        register = golden('register_params.json')
        register['cluster'] = {'uid': 'uid-' + name, 'name': name}
        with db.cursor() as cr:
            env = environment(cr, SUPERUSER_ID)
            cluster = env['vworkspace.cluster'].create({'name': name})
            env['vworkspace.application'].create({
                'cluster_id': cluster.id, 'namespace': 'team-a', 'name': 'wiki', 'chart_name': 'wiki',
                'chart_repository_url': 'https://charts.example.com'})
            env['vworkspace.cluster'].with_user(cluster.bot_user_id).agent_register(**register)
            cluster_id, bot_id, epoch, revision = cluster.id, cluster.bot_user_id.id, cluster.epoch, cluster.revision
            cr.commit()
        params = {
            'protocol_version': '1.5', 'cluster_uid': 'uid-' + name, 'agent_instance': 'agent-1',
            'known': {'epoch': epoch, 'revision': revision},
            'acks': [{'epoch': epoch, 'revision': revision, 'outcome': 'applied', 'processed_at': '2026-11-21T10:05:31Z',
                      'objects': [{'kind': 'ApplicationInstance', 'namespace': 'team-a', 'name': 'wiki',
                                   'outcome': 'applied', 'uid': 'u-1', 'generation': 1}]}],
            'reports': [dict(golden('sync_params_resync.json')['reports'][0], uid='u-1')],
        }
        locks = []
        store_ack = VworkspaceCluster._store_ack
        lock = VworkspaceCluster._lock

        def slow_store_ack(self, ack, now):
            res = store_ack(self, ack, now)
            time.sleep(0.3)  # hold the row lock a while: the other call comes in meanwhile
            return res

        def counted_lock(self):
            locks.append(threading.get_ident())
            return lock(self)

        barrier = threading.Barrier(2)
        results, errors = [], []

        def agent_call():
            try:
                with db.cursor() as cr:
                    env = environment(cr, bot_id)
                    barrier.wait(timeout=10)
                    results.append(retrying(lambda: env['vworkspace.cluster'].agent_sync(**params), env))
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))

        try:
            # As HttpCase does (odoo/tests/common.py, _registry_test_mode_patches): the registry's
            # class lock is held by the test runner's thread.
            with patch.object(Registry, '_lock', DummyRLock()), \
                    patch.object(VworkspaceCluster, '_store_ack', slow_store_ack), \
                    patch.object(VworkspaceCluster, '_lock', counted_lock):
                threads = [threading.Thread(target=agent_call) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=20)
            stuck = [t for t in threads if t.is_alive()]
            if stuck:
                import sys
                import traceback
                frames = sys._current_frames()
                self.fail("stuck: %s" % '\n'.join(''.join(traceback.format_stack(frames[t.ident])) for t in stuck))
            self.assertEqual(errors, [])
            self.assertEqual(len(results), 2)
            self.assertGreaterEqual(len(locks), 3, "the second call waited, failed to serialise and was retried")
            with db.cursor() as cr:
                cr.execute("SELECT count(*) FROM vworkspace_ack WHERE cluster_id = %s", [cluster_id])
                self.assertEqual(cr.fetchone()[0], 1)
                cr.execute("SELECT count(*) FROM vworkspace_ack_object WHERE cluster_id = %s", [cluster_id])
                self.assertEqual(cr.fetchone()[0], 1)
                cr.execute("SELECT count(*) FROM vworkspace_report WHERE cluster_id = %s", [cluster_id])
                self.assertEqual(cr.fetchone()[0], 1)
                cr.execute("SELECT syncs FROM vworkspace_cluster WHERE id = %s", [cluster_id])
                self.assertEqual(cr.fetchone()[0], 2)
        finally:
            with db.cursor() as cr:
                env = environment(cr, SUPERUSER_ID)
                env['vworkspace.cluster'].browse(cluster_id).unlink()
                cr.commit()
