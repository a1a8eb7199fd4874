# Part of vworkspace-operator. License LGPL-3.
"""Pure helpers of the protocol (no ORM): versions, timestamps, parameter checks, specs.

Everything the JSON-2 answer carries is built here as plain str/int/bool/dict/list, so
Odoo's ``json_default`` (odoo/tools/json.py: a datetime becomes "YYYY-MM-DD HH:MM:SS")
never formats one of our values.
"""
import copy
import json
import re
import secrets
from datetime import datetime, timezone

from .exceptions import InvalidParams, ProtocolVersionMismatch

PROTOCOL_VERSION = (1, 5)
PROTOCOL_VERSION_STR = '%d.%d' % PROTOCOL_VERSION
EPOCH_RE = re.compile(r'^[A-Za-z0-9._-]{1,64}$')
DNS_LABEL_RE = re.compile(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')
REQUEST_ID_RE = re.compile(r'^[A-Za-z0-9]([-A-Za-z0-9_.:]*[A-Za-z0-9])?$')
VERSION_RE = re.compile(r'^(\d+)\.(\d+)$')
KINDS = ('ApplicationInstance', 'Operation')
DEFAULT_MAX_REPORTS = 200
MAX_REPORTS_CAP = 500  # the agent's own batch size is at most 500 (--report-batch-size)
MAX_REASON = 1024

# The parameters of each method, all of protocol 1.0 (protocol.md, "Version and compatibility").
REGISTER_PARAMS = ('protocol_version', 'cluster', 'agent', 'allowed_namespaces', 'capabilities')
SYNC_PARAMS = ('protocol_version', 'cluster_uid', 'agent_instance', 'known', 'acks', 'reports',
               'resync', 'more', 'last_error')


def parse_version(value):
    """(major, minor) of a "MAJOR.MINOR" string; InvalidParams when it is not one."""
    if not isinstance(value, str) or not VERSION_RE.match(value):
        raise InvalidParams("protocol_version: expected a string \"MAJOR.MINOR\" (got %s)" % json.dumps(value))
    major, minor = VERSION_RE.match(value).groups()
    return int(major), int(minor)


def check_version(value, method, unknown_params):
    """The agent's version, checked: another MAJOR is ProtocolVersionMismatch, and so is a
    parameter this version does not have (a peer of a later MINOR that did not wait for us to
    announce it, or a MAJOR change that kept the number)."""
    version = parse_version(value)
    if version[0] != PROTOCOL_VERSION[0]:
        raise ProtocolVersionMismatch(
            "protocol version %s is not supported; this server speaks %d.x" % (value, PROTOCOL_VERSION[0]))
    if unknown_params:
        raise ProtocolVersionMismatch(
            "%s() got parameters that protocol %s does not have: %s (sent with protocol_version %s)"
            % (method, PROTOCOL_VERSION_STR, ', '.join(sorted(unknown_params)), value))
    return version


def version_str(version):
    return '%d.%d' % tuple(version)


# -- timestamps ---------------------------------------------------------------------------

def rfc3339(dt):
    """A naive UTC datetime (as the ORM holds them) as RFC 3339 with "Z", whole seconds."""
    if not dt:
        return None
    if dt.tzinfo is not None:
        dt = dt.astimezone(timezone.utc).replace(tzinfo=None)
    return dt.strftime('%Y-%m-%dT%H:%M:%SZ')


def parse_timestamp(value):
    """An RFC 3339 string as a naive UTC datetime, or None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith(('z', 'Z')):
        text = text[:-1] + '+00:00'
    # Python 3.11 reads up to 6 digits of fraction; RFC 3339 allows more (Kubernetes: 9).
    m = re.match(r'^(.*T\d\d:\d\d:\d\d)\.(\d+)(.*)$', text)
    if m:
        text = '%s.%s%s' % (m.group(1), m.group(2)[:6], m.group(3))
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return dt
    return dt.astimezone(timezone.utc).replace(tzinfo=None)


def new_epoch(prefix):
    """A fresh epoch: never one used before (rule 6), 1-64 of [A-Za-z0-9._-]."""
    stamp = datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')
    epoch = '%s-%s-%s' % (prefix, stamp, secrets.token_hex(4))
    return re.sub(r'[^A-Za-z0-9._-]', '-', epoch)[-64:]


# -- parameter checks -----------------------------------------------------------------------

def _where(path):
    return path


def require(cond, message):
    if not cond:
        raise InvalidParams(message)


def check_str(value, path, optional=False, empty=False):
    if value is None and optional:
        return None
    require(isinstance(value, str) and (empty or value != ''),
            "%s: expected a%s string (got %s)" % (path, '' if empty else ' non-empty', json.dumps(value)[:80]))
    return value


def check_int(value, path, optional=False, minimum=None):
    if value is None and optional:
        return None
    require(isinstance(value, int) and not isinstance(value, bool),
            "%s: expected an integer (got %s)" % (path, json.dumps(value)[:80]))
    if minimum is not None:
        require(value >= minimum, "%s: expected an integer >= %d (got %d)" % (path, minimum, value))
    return value


def check_bool(value, path, default=False):
    if value is None:
        return default
    require(isinstance(value, bool), "%s: expected a boolean (got %s)" % (path, json.dumps(value)[:80]))
    return value


def check_dict(value, path, optional=False):
    if value is None and optional:
        return None
    require(isinstance(value, dict), "%s: expected an object (got %s)" % (path, json.dumps(value)[:80]))
    return value


def check_list(value, path, optional=False):
    if value is None and optional:
        return []
    require(isinstance(value, (list, tuple)), "%s: expected an array (got %s)" % (path, json.dumps(value)[:80]))
    return list(value)


def check_object_key(obj, path):
    """kind, namespace, name of a report or an acknowledgement entry (kind kept as text:
    a later MINOR may add kinds, and an unknown value must not be an error)."""
    check_dict(obj, path)
    return (check_str(obj.get('kind'), path + '.kind'),
            check_str(obj.get('namespace'), path + '.namespace'),
            check_str(obj.get('name'), path + '.name'))


def as_int(value):
    """A resource_version read as an integer, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def dumps(value):
    """JSON text as stored in the Text fields (stable, readable)."""
    if value is None:
        return False
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def loads(text, default=None):
    if not text:
        return copy.deepcopy(default)
    return json.loads(text)


def deep_merge(base, extra):
    """``extra`` merged into a copy of ``base`` (objects merged key by key, anything else
    replaced)."""
    out = copy.deepcopy(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# -- features and the versions that add them (protocol.md, "Version history") ---------------

def application_min_version(spec):
    """The lowest protocol version whose agents understand every field of this
    ApplicationInstance spec."""
    need = (1, 0)
    if 'backupSchedule' in spec:
        need = max(need, (1, 1))
    if 'maintenanceWindows' in spec:
        need = max(need, (1, 2))
    if 'restoreVerification' in spec:
        need = max(need, (1, 3))
    if 'test' in spec:
        need = max(need, (1, 5))
    return need


def operation_min_version(spec):
    """The same for an Operation spec."""
    need = (1, 0)
    if 'urgent' in spec:
        need = max(need, (1, 2))
    if isinstance(spec.get('upgrade'), dict) and 'backup' in spec['upgrade']:
        need = max(need, (1, 2))
    restore = spec.get('restore')
    if isinstance(restore, dict):
        if 'targetNamespace' in restore:
            need = max(need, (1, 2))
        if 'verify' in restore:
            need = max(need, (1, 3))
    return need
