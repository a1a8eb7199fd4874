# Part of vworkspace-operator. License LGPL-3.
"""Shared helpers: the golden files of crates/protocol/tests/golden/ (the repository's,
read where they are, never copied) and a cluster whose bot calls the protocol."""
import contextlib
import copy
import json
import os
import re

from odoo.http import serialize_exception
from odoo.tests.common import TransactionCase

ADDON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.environ.get('VWS_GOLDEN_DIR') or os.path.normpath(
    os.path.join(ADDON_DIR, '..', '..', '..', 'crates', 'protocol', 'tests', 'golden'))
RFC3339_Z = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$')
# Answer members the golden files may lack (optional, or added by a later MINOR).
OPTIONAL_ANSWER_FIELDS = {'max_reports_per_sync', 'next_sync_seconds', 'resync_requested', 'sync_interval_seconds'}


# Golden file name -> ids of the tests in which it was compared, recorded at run time by the
# comparison helpers below once their assertions passed (reading a file is not replaying it).
# test_golden.TestEveryGoldenFileCompared, which runs after every other test of the addon,
# fails on a file missing here.
COMPARED = {}


def record_comparison(name, test):
    golden(name)  # a name that is not a golden file fails here, not silently
    COMPARED.setdefault(name, set()).add(test.id())


def assert_golden_error_body(test, body, name):
    """``body`` (an error as JSON-2 answers it, or odoo.http.serialize_exception's dict) is the
    golden error ``name``, its traceback (``debug``) aside."""
    expected = golden(name)
    test.assertEqual(set(body), set(expected), "members")
    for key in ('name', 'message', 'context'):
        test.assertEqual(body[key], expected[key], key)
    test.assertEqual(list(body['arguments']), expected['arguments'], 'arguments')
    record_comparison(name, test)


def golden(name):
    path = os.path.join(GOLDEN_DIR, name)
    if not os.path.exists(path):
        raise AssertionError("golden file %s not found (the addon reads the repository's "
                             "crates/protocol/tests/golden/; set VWS_GOLDEN_DIR elsewhere)" % path)
    with open(path, encoding='utf-8') as f:
        return json.load(f)


def golden_names():
    return sorted(n for n in os.listdir(GOLDEN_DIR) if n.endswith('.json'))


class VwsCase(TransactionCase):
    """A cluster record named as in the golden files, and its bot."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.Cluster = cls.env['vworkspace.cluster']
        cls.App = cls.env['vworkspace.application']
        cls.Op = cls.env['vworkspace.operation']
        cls.Deletion = cls.env['vworkspace.deletion']
        cls.Report = cls.env['vworkspace.report']
        cls.Ack = cls.env['vworkspace.ack']
        cls.cluster = cls.Cluster.create({'name': 'edge-paris-1'})
        cls.bot = cls.cluster.bot_user_id

    # -- calls as the agent -------------------------------------------------------------

    def agent(self, record=None):
        record = record or self.cluster
        return self.env['vworkspace.cluster'].with_user(record.bot_user_id)

    def register(self, version='1.5', record=None, **overrides):
        params = golden('register_params.json')
        params['protocol_version'] = version
        params.update(overrides)
        return self.agent(record).agent_register(**params)

    def sync(self, record=None, **params):
        base = {'protocol_version': '1.5', 'cluster_uid': golden('register_params.json')['cluster']['uid'],
                'agent_instance': 'agent-7d9f8b6c5-x2x9q', 'acks': [], 'reports': [], 'more': False}
        base.update(params)
        result = self.agent(record).agent_sync(**base)
        # What JSON-2 sends must be JSON as it is: no datetime for json_default to format.
        self.assertEqual(json.loads(json.dumps(result)), result)
        return result

    # -- intent from a golden document ----------------------------------------------------

    def load_document(self, desired, cluster=None):
        """Intent records whose document is ``desired``, at its epoch and revision."""
        cluster = cluster or self.cluster
        for app in desired['applications']:
            self.App.create(dict(self.App._vals_from_spec(app['spec']), cluster_id=cluster.id,
                                 namespace=app['namespace'], name=app['name']))
        for op in desired['operations']:
            self.Op.create(dict(self.Op._vals_from_spec(op['spec']), cluster_id=cluster.id,
                                namespace=op['namespace'], name=op['name']))
        for d in desired['deletions']:
            self.Deletion.create({'cluster_id': cluster.id, 'kind': d['kind'], 'namespace': d['namespace'],
                                  'name': d['name'], 'uid': d.get('uid'), 'reason': d.get('reason')})
        cluster.with_context(vws_internal=True).write({'epoch': desired['epoch'], 'revision': desired['revision']})

    # -- comparisons ----------------------------------------------------------------------

    def assertGoldenAnswer(self, result, name, **overrides):
        """``result`` is the golden answer ``name`` (with ``overrides`` for the members only
        known at run time, such as a record id): see assertAnswer."""
        expected = golden(name)
        expected.update(overrides)
        self.assertAnswer(result, expected)
        record_comparison(name, self)

    @contextlib.contextmanager
    def replaying(self, name):
        """The golden input ``name``, for a block that sends it to the addon and checks what
        the addon made of it: recorded as compared only when the block ends without failure."""
        yield golden(name)
        record_comparison(name, self)

    def assertAnswer(self, result, expected, timing=('server_time',)):
        """``result`` has every member of the golden answer with its value (the timing and
        Odoo's own protocol_version aside), and nothing else but optional members."""
        for key in timing:
            if key in expected:
                self.assertRegex(result[key], RFC3339_Z, key)
        self.assertEqual(result['protocol_version'], '1.5')
        extra = set(result) - set(expected)
        self.assertLessEqual(extra, OPTIONAL_ANSWER_FIELDS, "unexpected members")
        for key, value in expected.items():
            if key in timing or key == 'protocol_version':
                continue
            if key == 'desired':
                self.assertDocument(result.get('desired'), value)
            else:
                self.assertEqual(result.get(key), value, key)

    def assertDocument(self, got, expected):
        self.assertIsNotNone(got, "no desired document")
        got, expected = copy.deepcopy(got), copy.deepcopy(expected)
        self.assertRegex(got.pop('generated_at'), RFC3339_Z)
        expected.pop('generated_at', None)
        self.assertEqual(got, expected)

    def assertGoldenError(self, exc, name):
        """The error JSON-2 would answer (odoo/http.py serialize_exception) is the golden
        one, its traceback (``debug``) aside."""
        assert_golden_error_body(self, serialize_exception(exc), name)
