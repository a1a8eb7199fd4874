# Part of vworkspace-operator. License LGPL-3.
"""Intent: what Odoo wants on a cluster (applications, Operations, deletions).

Every change of an intent field bumps the cluster's revision in the same transaction and
remembers that revision on the record (protocol.md, checklist item 2), so that the status
view can tell whether the change was acknowledged (protocol.md, "Reading status in Odoo").
"""
import copy
import json
from datetime import timedelta

from odoo import api, fields, models
from odoo.exceptions import UserError, ValidationError

from .. import protocol as P

STATUS = [
    ('held', 'Held: the agent is too old'),
    ('not_acknowledged', 'Not acknowledged'),
    ('refused', 'Refused'),
    ('apply_failed', 'Apply failed (retried)'),
    ('progressing', 'Applied, not ready'),
    ('ready', 'Ready'),
    ('suspended', 'Suspended'),
    ('pending', 'Pending'),
    ('running', 'Running'),
    ('succeeded', 'Succeeded'),
    ('failed', 'Failed'),
    ('expired', 'Expired'),
    ('deleting', 'Deleting'),
    ('deleted', 'Deleted'),
    ('absent', 'Absent'),
    ('unknown', 'Unknown'),
]
# Object outcomes after which an Operation or a deletion is no longer sent (protocol.md,
# "The desired-state document": "send an operation until it has been acknowledged").
OPERATION_DONE = ('applied', 'unchanged', 'refused', 'conflict')
DELETION_DONE = ('deleted', 'absent')


def _json_field_check(record, fname, expected, label):
    text = record[fname]
    if not text:
        return
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValidationError("%s: not JSON (%s)" % (label, exc)) from exc
    if not isinstance(value, expected):
        raise ValidationError("%s: expected a JSON %s" % (label, 'object' if expected is dict else 'array'))


class VworkspaceIntentMixin(models.AbstractModel):
    _name = 'vworkspace.intent.mixin'
    _description = 'vWorkspace intent (common fields)'
    _order = 'cluster_id, namespace, name'

    _kind = None
    # Fields whose change is a change of the desired state (bumps the revision).
    _intent_fields = ('active', 'namespace', 'name', 'cluster_id')
    _ack_fields = ('ack_epoch', 'ack_revision', 'ack_outcome', 'ack_reason', 'ack_message', 'ack_uid',
                   'ack_generation', 'ack_conflict')

    cluster_id = fields.Many2one('vworkspace.cluster', string='Cluster', required=True, ondelete='cascade',
                                 index=True)
    namespace = fields.Char(required=True, help="Kubernetes namespace (must be in the agent's allow-list)")
    name = fields.Char(required=True)
    active = fields.Boolean(default=True)
    changed_revision = fields.Integer('Changed at revision', readonly=True, copy=False,
                                      help="The cluster's revision that last changed this intent")

    # The latest acknowledgement entry for it (written by agent_sync, never by a person).
    ack_epoch = fields.Char('Acknowledged in epoch', readonly=True, copy=False)
    ack_revision = fields.Integer('Acknowledged revision', readonly=True, copy=False)
    ack_outcome = fields.Char('Acknowledged as', readonly=True, copy=False)
    ack_reason = fields.Char('Acknowledgement reason', readonly=True, copy=False)
    ack_message = fields.Text('Acknowledgement message', readonly=True, copy=False)
    ack_uid = fields.Char('UID (acknowledged)', readonly=True, copy=False)
    ack_generation = fields.Integer('Acknowledged generation', readonly=True, copy=False)
    ack_conflict = fields.Text('Conflict', readonly=True, copy=False)

    # What the cluster says about it (computed from the acknowledgement and the latest report).
    acknowledged = fields.Boolean(compute='_compute_status')
    status = fields.Selection(STATUS, compute='_compute_status')
    status_message = fields.Char(compute='_compute_status')
    report_id = fields.Many2one('vworkspace.report', string='Latest report', compute='_compute_status')
    report_state = fields.Char('Reported state', compute='_compute_status')
    report_uid = fields.Char('Object UID', compute='_compute_status')
    report_resource_version = fields.Char('Resource version', compute='_compute_status')
    report_conditions = fields.Text('Conditions', compute='_compute_status')
    min_protocol_version = fields.Char('Needs protocol', compute='_compute_status')

    # -- revisions ------------------------------------------------------------------------

    def _kind_of(self):
        return self._kind

    @api.model_create_multi
    def create(self, vals_list):
        # An archived object of the same key must be archived in the database before the
        # partial unique index (WHERE active) sees the new one.
        for model in ('vworkspace.application', 'vworkspace.operation', 'vworkspace.deletion'):
            self.env[model].flush_model(['active'])
        records = super().create(vals_list)
        for cluster in records.cluster_id:
            mine = records.filtered(lambda r, c=cluster: r.cluster_id == c)
            revision = cluster._bump_revision()
            mine.with_context(vws_internal=True).write({'changed_revision': revision})
        records._drop_contradicting_intent()
        return records

    def write(self, vals):
        if ({'changed_revision', *self._ack_fields} & set(vals)) and not self.env.context.get('vws_internal'):
            raise UserError("changed_revision and the acknowledgement are the protocol's: they cannot be written")
        intent = set(vals) & set(self._intent_fields)
        before = self.cluster_id
        res = super().write(vals)
        if intent:
            for cluster in before | self.cluster_id:
                revision = cluster._bump_revision()
                self.filtered(lambda r, c=cluster: r.cluster_id == c).with_context(
                    vws_internal=True).write({'changed_revision': revision})
            self._drop_contradicting_intent()
        return res

    def unlink(self):
        clusters = self.cluster_id
        res = super().unlink()
        for cluster in clusters.exists():
            cluster._bump_revision()
        return res

    def _drop_contradicting_intent(self):
        """An object must not be both desired and deleted (the whole document would be
        refused): declaring one archives the other."""

    # -- status ---------------------------------------------------------------------------

    def _entry_key(self):
        self.ensure_one()
        return (self._kind_of(), self.namespace, self.name)

    def _spec(self):
        return {}

    def _min_version(self):
        return (1, 0)

    def _ack(self):
        """The acknowledgement entry stored for this object, if it covers the last change
        (a revision >= the one that last changed it, in the current or a past epoch)."""
        self.ensure_one()
        if not self.ack_revision or self.ack_revision < (self.changed_revision or 0):
            return None
        if self.ack_epoch not in self.cluster_id._known_epochs():
            return None
        return self

    def _record_ack(self, entry, epoch, revision):
        """Keep an acknowledgement entry for this object if it is the newest one seen."""
        self.ensure_one()
        if revision < (self.changed_revision or 0) or revision < (self.ack_revision or 0):
            return
        conflict = entry.get('conflict')
        generation = entry.get('generation')
        self.with_context(vws_internal=True).write({
            'ack_epoch': epoch,
            'ack_revision': revision,
            'ack_outcome': str(entry.get('outcome') or ''),
            'ack_reason': entry.get('reason') if isinstance(entry.get('reason'), str) else False,
            'ack_message': entry.get('message') if isinstance(entry.get('message'), str) else False,
            'ack_uid': entry.get('uid') if isinstance(entry.get('uid'), str) else False,
            'ack_generation': generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
            'ack_conflict': P.dumps(conflict) if conflict is not None else False,
        })

    def _latest_report(self):
        self.ensure_one()
        kind, namespace, name = self._entry_key()
        return self.env['vworkspace.report'].sudo().search([
            ('cluster_id', '=', self.cluster_id.id),
            ('kind', '=', kind), ('namespace', '=', namespace), ('name', '=', name),
        ], limit=1)

    def _held(self):
        """Not sent: the spec uses a feature of a later MINOR than the agent announced."""
        agent = self.cluster_id._agent_version()
        return agent is not None and self._min_version() > agent

    @api.depends('changed_revision', 'ack_revision', 'ack_outcome', 'cluster_id.revision', 'cluster_id.last_seen')
    def _compute_status(self):
        for rec in self:
            vals = dict(acknowledged=False, status='unknown', status_message=False, report_id=False,
                        report_state=False, report_uid=False, report_resource_version=False,
                        report_conditions=False, min_protocol_version=False)
            if not rec.id or not rec.cluster_id:
                rec.update(vals)
                continue
            try:
                vals['min_protocol_version'] = P.version_str(rec._min_version())
            except (ValueError, TypeError):
                pass
            ack = rec._ack()
            report = rec._latest_report()
            if report:
                vals.update(report_id=report.id, report_state=report.state, report_uid=report.uid,
                            report_resource_version=report.resource_version,
                            report_conditions=report.conditions)
            vals['acknowledged'] = bool(ack)
            vals['status'], vals['status_message'] = rec._status_of(ack, report)
            if rec.cluster_id.last_seen and not rec.cluster_id.agent_online:
                vals['status_message'] = "agent offline: as of %s. %s" % (
                    P.rfc3339(rec.cluster_id.last_seen), vals['status_message'] or '')
            rec.update(vals)

    def _status_of(self, ack, report):
        if not ack:
            if self.active and self._held():
                return 'held', "needs an agent of protocol >= %s; the agent announced %s" % (
                    P.version_str(self._min_version()), self.cluster_id.agent_protocol_version)
            return 'not_acknowledged', False
        if ack.ack_outcome == 'refused':
            return 'refused', "%s: %s" % (ack.ack_reason or 'refused', ack.ack_message or '')
        if ack.ack_outcome == 'failed':
            return 'apply_failed', "%s: %s" % (ack.ack_reason or 'failed', ack.ack_message or '')
        if ack.ack_outcome in ('deleted', 'absent'):
            return ack.ack_outcome, ack.ack_message
        if not report:
            return 'progressing', "acknowledged %s, no report yet" % ack.ack_outcome
        state = report.state or 'unknown'
        ready = report.ready_message or False
        if state == 'ready':
            fresh = (report.observed_generation or 0) >= (ack.ack_generation or 0) and \
                report.observed_generation == report.generation
            if fresh:
                return 'ready', ready
            return 'progressing', "observed generation %s < acknowledged generation %s" % (
                report.observed_generation, ack.ack_generation)
        if state == 'not_ready':
            return 'progressing', "not ready: %s" % (ready or '')
        if state in dict(STATUS):
            return state, ready or report.result or False
        return 'unknown', "reported state %r" % state


class VworkspaceApplication(models.Model):
    _name = 'vworkspace.application'
    _description = 'vWorkspace application (desired ApplicationInstance)'
    _inherit = ['vworkspace.intent.mixin']
    _order = 'cluster_id, namespace, name'
    _kind = 'ApplicationInstance'
    _intent_fields = VworkspaceIntentMixin._intent_fields + (
        'chart_name', 'chart_version', 'chart_repository_url', 'chart_repository_interval', 'values_json',
        'timeout', 'target_namespace', 'suspend', 'backup_cron', 'backup_time_zone', 'backup_keep_last',
        'backup_ttl', 'backup_missed_run_policy', 'backup_starting_deadline_seconds', 'backup_suspend',
        'backup_include_volumes', 'backup_volume_method', 'backup_storage_location',
        'maintenance_windows_json', 'verification_timeout_seconds', 'verification_job_json', 'test_enable',
        'test_timeout', 'test_ignore_failures', 'spec_extra_json')

    _key_uniq = models.UniqueIndex('(cluster_id, namespace, name) WHERE active',
                                   'An application of that namespace and name is already declared on this cluster.')

    chart_name = fields.Char('Chart', required=True)
    chart_version = fields.Char('Chart version', help="An exact version or a semver range; empty: the latest")
    chart_repository_url = fields.Char('Repository URL', help="https://… (a Helm index) or oci://…")
    chart_repository_interval = fields.Char('Repository interval', help="A duration, e.g. 1h")
    values_json = fields.Text('Values (JSON object)')
    timeout = fields.Char(help="A duration, e.g. 5m")
    target_namespace = fields.Char()
    suspend = fields.Boolean()
    # Backup schedule (1.1)
    backup_cron = fields.Char('Backup schedule (cron)', help="Five fields or @daily…; empty: no schedule")
    backup_time_zone = fields.Char('Schedule time zone', help="IANA name; empty: UTC")
    backup_keep_last = fields.Integer('Keep last', help="1-100")
    backup_ttl = fields.Char('Backup TTL', help="A Go duration, e.g. 720h")
    backup_missed_run_policy = fields.Selection([('RunOnce', 'Run once'), ('Skip', 'Skip')], 'Missed runs')
    backup_starting_deadline_seconds = fields.Integer('Starting deadline (s)')
    backup_suspend = fields.Boolean('Schedule suspended')
    backup_include_volumes = fields.Boolean('Include volumes')
    backup_volume_method = fields.Selection([('Snapshot', 'Snapshot'), ('FileSystem', 'File system')],
                                            'Volume method')
    backup_storage_location = fields.Char('Storage location')
    # Maintenance windows (1.2)
    maintenance_windows_json = fields.Text(
        'Maintenance windows (JSON array)',
        help='e.g. [{"days": ["Saturday", "Sunday"], "start": "02:00", "duration": "2h", '
             '"timeZone": "Europe/Brussels"}]')
    # Verified restores (1.3)
    verification_timeout_seconds = fields.Integer('Verification timeout (s)', help="30-86400; empty: 600")
    verification_job_json = fields.Text('Verification Job (JSON JobSpec)')
    # Helm tests (1.5)
    test_enable = fields.Boolean("Run the chart's tests")
    test_timeout = fields.Char('Test timeout')
    test_ignore_failures = fields.Boolean('Ignore test failures')
    spec_extra_json = fields.Text('More spec (JSON object, merged last)',
                                  help="Any other ApplicationInstance spec field, e.g. valuesFrom, dependsOn")
    spec_json = fields.Text('Spec sent', compute='_compute_spec_json')

    # From the latest report.
    deployed_chart_version = fields.Char(compute='_compute_report_fields')
    desired_chart_version = fields.Char('Desired version (cluster)', compute='_compute_report_fields')
    ready_reason = fields.Char(compute='_compute_report_fields')
    ready_since = fields.Datetime(compute='_compute_report_fields')
    backup_schedule_report = fields.Text('Backup schedule (reported)', compute='_compute_report_fields')
    test_success = fields.Char('TestSuccess', compute='_compute_report_fields')
    reconciling = fields.Char('Reconciling', compute='_compute_report_fields')

    @api.depends('report_id')
    def _compute_report_fields(self):
        for rec in self:
            rep = rec.report_id
            conditions = {c.get('type'): c for c in (P.loads(rep.conditions, []) if rep else []) if isinstance(c, dict)}

            def cond(kind):
                c = conditions.get(kind)
                return "%s %s: %s" % (c.get('status'), c.get('reason'), c.get('message') or '') if c else False
            rec.deployed_chart_version = rep.deployed_chart_version if rep else False
            rec.desired_chart_version = rep.desired_chart_version if rep else False
            rec.ready_reason = rep.ready_reason if rep else False
            rec.ready_since = rep.ready_since if rep else False
            rec.backup_schedule_report = rep.backup_schedule if rep else False
            rec.test_success = cond('TestSuccess')
            rec.reconciling = cond('Reconciling')

    @api.constrains('name', 'namespace', 'values_json', 'maintenance_windows_json', 'verification_job_json',
                    'spec_extra_json', 'backup_keep_last')
    def _check_application(self):
        for rec in self:
            if not P.DNS_LABEL_RE.match(rec.name or '') or len(rec.name) > 63:
                raise ValidationError("%r: an application's name must be a DNS-1123 label "
                                      "(at most 63 lowercase alphanumerics or '-')" % rec.name)
            if not P.DNS_LABEL_RE.match(rec.namespace or '') or len(rec.namespace) > 63:
                raise ValidationError("%r: a namespace must be a DNS label" % rec.namespace)
            _json_field_check(rec, 'values_json', dict, 'Values')
            _json_field_check(rec, 'maintenance_windows_json', list, 'Maintenance windows')
            _json_field_check(rec, 'verification_job_json', dict, 'Verification Job')
            _json_field_check(rec, 'spec_extra_json', dict, 'More spec')
            if rec.backup_keep_last and not 1 <= rec.backup_keep_last <= 100:
                raise ValidationError("Keep last: 1 to 100")

    def _drop_contradicting_intent(self):
        for rec in self.filtered('active'):
            self.env['vworkspace.deletion'].search([
                ('cluster_id', '=', rec.cluster_id.id), ('kind', '=', self._kind),
                ('namespace', '=', rec.namespace), ('name', '=', rec.name)]).write({'active': False})

    def _spec(self):
        """The ApplicationInstance spec sent (docs/api/application-instance.md)."""
        self.ensure_one()
        spec = {'chart': {'name': self.chart_name}}
        if self.chart_version:
            spec['chart']['version'] = self.chart_version
        if self.chart_repository_url:
            spec['chart']['repository'] = {'url': self.chart_repository_url}
            if self.chart_repository_interval:
                spec['chart']['repository']['interval'] = self.chart_repository_interval
        if self.values_json:
            spec['values'] = P.loads(self.values_json)
        if self.timeout:
            spec['timeout'] = self.timeout
        if self.target_namespace:
            spec['targetNamespace'] = self.target_namespace
        if self.suspend:
            spec['suspend'] = True
        if self.backup_cron:
            bs = {'cron': self.backup_cron}
            if self.backup_time_zone:
                bs['timeZone'] = self.backup_time_zone
            if self.backup_keep_last:
                bs['keepLast'] = self.backup_keep_last
            if self.backup_ttl:
                bs['ttl'] = self.backup_ttl
            if self.backup_missed_run_policy:
                bs['missedRunPolicy'] = self.backup_missed_run_policy
            if self.backup_starting_deadline_seconds:
                bs['startingDeadlineSeconds'] = self.backup_starting_deadline_seconds
            if self.backup_suspend:
                bs['suspend'] = True
            backup = {}
            if self.backup_include_volumes:
                backup['includeVolumes'] = True
            if self.backup_volume_method:
                backup['volumeMethod'] = self.backup_volume_method
            if self.backup_storage_location:
                backup['storageLocation'] = self.backup_storage_location
            if backup:
                bs['backup'] = backup
            spec['backupSchedule'] = bs
        if self.maintenance_windows_json:
            spec['maintenanceWindows'] = P.loads(self.maintenance_windows_json)
        if self.verification_timeout_seconds or self.verification_job_json:
            rv = {}
            if self.verification_timeout_seconds:
                rv['timeoutSeconds'] = self.verification_timeout_seconds
            if self.verification_job_json:
                rv['job'] = P.loads(self.verification_job_json)
            spec['restoreVerification'] = rv
        if self.test_enable:
            test = {}
            if self.test_timeout:
                test['timeout'] = self.test_timeout
            if self.test_ignore_failures:
                test['ignoreFailures'] = True
            spec['test'] = test
        return P.deep_merge(spec, P.loads(self.spec_extra_json, {}))

    @api.model
    def _vals_from_spec(self, spec):
        """Field values that give back exactly ``spec`` (the inverse of ``_spec``): what a
        field can hold is lifted into it, anything else stays in ``spec_extra_json``."""
        spec = copy.deepcopy(spec)
        vals = {}

        def lift(obj, key, fname, test, target=vals):
            if key in obj and test(obj[key]):
                target[fname] = obj.pop(key)

        is_str = lambda v: isinstance(v, str) and v != ''  # noqa: E731
        is_pos = lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0  # noqa: E731
        is_true = lambda v: v is True  # noqa: E731
        chart = spec.get('chart')
        if isinstance(chart, dict):
            lift(chart, 'name', 'chart_name', is_str)
            lift(chart, 'version', 'chart_version', is_str)
            repo = chart.get('repository')
            if isinstance(repo, dict) and is_str(repo.get('url')):
                lift(repo, 'url', 'chart_repository_url', is_str)
                lift(repo, 'interval', 'chart_repository_interval', is_str)
                if not repo:
                    chart.pop('repository')
            if not chart:
                spec.pop('chart')
        if isinstance(spec.get('values'), dict):
            vals['values_json'] = P.dumps(spec.pop('values'))
        lift(spec, 'timeout', 'timeout', is_str)
        lift(spec, 'targetNamespace', 'target_namespace', is_str)
        lift(spec, 'suspend', 'suspend', is_true)
        bs = spec.get('backupSchedule')
        if isinstance(bs, dict) and is_str(bs.get('cron')):
            lift(bs, 'cron', 'backup_cron', is_str)
            lift(bs, 'timeZone', 'backup_time_zone', is_str)
            lift(bs, 'keepLast', 'backup_keep_last', is_pos)
            lift(bs, 'ttl', 'backup_ttl', is_str)
            lift(bs, 'missedRunPolicy', 'backup_missed_run_policy', lambda v: v in ('RunOnce', 'Skip'))
            lift(bs, 'startingDeadlineSeconds', 'backup_starting_deadline_seconds', is_pos)
            lift(bs, 'suspend', 'backup_suspend', is_true)
            backup = bs.get('backup')
            if isinstance(backup, dict):
                lift(backup, 'includeVolumes', 'backup_include_volumes', is_true)
                lift(backup, 'volumeMethod', 'backup_volume_method', lambda v: v in ('Snapshot', 'FileSystem'))
                lift(backup, 'storageLocation', 'backup_storage_location', is_str)
                if not backup:
                    bs.pop('backup')
            if not bs:
                spec.pop('backupSchedule')
        if isinstance(spec.get('maintenanceWindows'), list):
            vals['maintenance_windows_json'] = P.dumps(spec.pop('maintenanceWindows'))
        rv = spec.get('restoreVerification')
        if isinstance(rv, dict) and rv and (set(rv) <= {'timeoutSeconds', 'job'}):
            ok_timeout = 'timeoutSeconds' not in rv or is_pos(rv['timeoutSeconds'])
            ok_job = 'job' not in rv or isinstance(rv['job'], dict)
            if ok_timeout and ok_job:
                if 'timeoutSeconds' in rv:
                    vals['verification_timeout_seconds'] = rv['timeoutSeconds']
                if 'job' in rv:
                    vals['verification_job_json'] = P.dumps(rv['job'])
                spec.pop('restoreVerification')
        test = spec.get('test')
        if isinstance(test, dict):
            vals['test_enable'] = True
            lift(test, 'timeout', 'test_timeout', is_str)
            lift(test, 'ignoreFailures', 'test_ignore_failures', is_true)
            if not test:
                spec.pop('test')
        vals['spec_extra_json'] = P.dumps(spec) if spec else False
        return vals

    @api.depends(*_intent_fields)
    def _compute_spec_json(self):
        for rec in self:
            try:
                rec.spec_json = P.dumps(rec._spec()) if rec.chart_name else False
            except ValueError as exc:
                rec.spec_json = "invalid: %s" % exc

    def _min_version(self):
        return P.application_min_version(self._spec())

    def _document_entry(self):
        return {'namespace': self.namespace, 'name': self.name, 'spec': self._spec()}

    def action_delete_on_cluster(self):
        """Delete on the cluster: drop the application from the document and send an
        explicit deletion carrying the UID last reported for it (protocol.md, "Deletion
        only by explicit intent")."""
        for rec in self:
            report = rec._latest_report()
            uid = report.uid if report and report.state != 'deleted' else False
            self.env['vworkspace.deletion'].create({
                'cluster_id': rec.cluster_id.id,
                'kind': self._kind,
                'namespace': rec.namespace,
                'name': rec.name,
                'uid': uid,
                'reason': self.env.context.get('vws_deletion_reason') or "deleted in Odoo by %s" % self.env.user.name,
            })
        return True

    def action_adopt_in_force(self):
        """ADR 0004: an Operation owns spec.chart.version and spec.values; take what is in
        force as this intent, so the conflict disappears."""
        for rec in self:
            conflict = P.loads(rec.ack_conflict, {}) if rec.ack_conflict else {}
            vals = {}
            if isinstance(conflict.get('chart_version_in_force'), str):
                vals['chart_version'] = conflict['chart_version_in_force']
            if isinstance(conflict.get('values_in_force'), dict):
                vals['values_json'] = P.dumps(conflict['values_in_force'])
            if vals:
                rec.write(vals)
        return True

    def action_verify_backup_form(self):
        self.ensure_one()
        return {
            'type': 'ir.actions.act_window', 'res_model': 'vworkspace.operation', 'view_mode': 'form',
            'target': 'current',
            'context': {'default_cluster_id': self.cluster_id.id, 'default_namespace': self.namespace,
                        'default_application_name': self.name, 'default_op_type': 'Backup'},
        }


OP_TYPES = [('Backup', 'Backup'), ('Restore', 'Restore'), ('Snapshot', 'Snapshot'), ('Upgrade', 'Upgrade'),
            ('Rollback', 'Rollback'), ('Runbook', 'Runbook')]


class VworkspaceOperation(models.Model):
    _name = 'vworkspace.operation'
    _description = 'vWorkspace Operation (a day-2 request)'
    _inherit = ['vworkspace.intent.mixin']
    _order = 'id desc'
    _kind = 'Operation'
    _intent_fields = VworkspaceIntentMixin._intent_fields + (
        'op_type', 'application_name', 'request_id', 'not_before', 'deadline', 'urgent', 'payload_json',
        'restore_verify', 'spec_extra_json')

    _key_uniq = models.UniqueIndex('(cluster_id, namespace, name) WHERE active',
                                   'An Operation of that namespace and name is already declared on this cluster.')
    _request_uniq = models.UniqueIndex('(cluster_id, request_id)',
                                       'That request id is already used on this cluster.')

    def _default_request_id(self):
        return self.env['ir.sequence'].sudo().next_by_code('vworkspace.operation.request') or False

    def _default_deadline(self):
        return fields.Datetime.now() + timedelta(days=1)

    name = fields.Char(required=False, help="At most 63 characters; empty: <application>-<type>-<request id>")
    op_type = fields.Selection(OP_TYPES, 'Type', required=True, default='Backup')
    application_name = fields.Char('Application', required=True, help="spec.applicationRef.name")
    request_id = fields.Char('Request id', required=True, copy=False, default=_default_request_id,
                             help="Odoo's idempotency key (spec.requestId)")
    not_before = fields.Datetime('Not before')
    deadline = fields.Datetime(default=_default_deadline,
                               help="Not started by then: Expired, doing nothing (set one on every Operation)")
    urgent = fields.Boolean(help="Start outside the application's maintenance windows (1.2)")
    payload_json = fields.Text('Payload (JSON object)',
                               help='spec.<type>, e.g. for a Restore {"source": {"operationName": "wiki-backup-1"}}')
    restore_verify = fields.Boolean('Verify the backup (restore into a scratch namespace)',
                                    help="Restore with verify: true (1.3): the application is not touched")
    spec_extra_json = fields.Text('More spec (JSON object, merged last)')
    spec_json = fields.Text('Spec sent', compute='_compute_spec_json')
    application_id = fields.Many2one('vworkspace.application', compute='_compute_application_id')

    # From the latest report.
    phase = fields.Char(compute='_compute_op_report')
    result = fields.Text(compute='_compute_op_report')
    start_time = fields.Datetime(compute='_compute_op_report')
    completion_time = fields.Datetime(compute='_compute_op_report')
    verification = fields.Text('Verification (reported)', compute='_compute_op_report')
    verification_passed = fields.Boolean(compute='_compute_op_report')
    succeeded_reason = fields.Char('Why (Succeeded condition)', compute='_compute_op_report')

    @api.depends('report_id')
    def _compute_op_report(self):
        for rec in self:
            rep = rec.report_id
            rec.phase = rep.phase if rep else False
            rec.result = rep.result if rep else False
            rec.start_time = rep.start_time if rep else False
            rec.completion_time = rep.completion_time if rep else False
            rec.verification = rep.verification if rep else False
            ver = P.loads(rep.verification, {}) if rep and rep.verification else {}
            rec.verification_passed = bool(isinstance(ver, dict) and ver.get('passed'))
            cond = [c for c in (P.loads(rep.conditions, []) if rep else [])
                    if isinstance(c, dict) and c.get('type') == 'Succeeded']
            rec.succeeded_reason = ("%s %s: %s" % (cond[0].get('status'), cond[0].get('reason'),
                                                   cond[0].get('message') or '')) if cond else False

    @api.depends('cluster_id', 'namespace', 'application_name')
    def _compute_application_id(self):
        for rec in self:
            rec.application_id = self.env['vworkspace.application'].search([
                ('cluster_id', '=', rec.cluster_id.id), ('namespace', '=', rec.namespace),
                ('name', '=', rec.application_name)], limit=1) if rec.cluster_id else False

    @api.model_create_multi
    def create(self, vals_list):
        for vals in vals_list:
            if not vals.get('name') and vals.get('application_name') and vals.get('op_type'):
                suffix = (vals.get('request_id') or self._default_request_id() or 'op').lower()
                vals.setdefault('request_id', suffix)
                name = '%s-%s-%s' % (vals['application_name'], vals['op_type'].lower(),
                                     ''.join(ch if ch.isalnum() or ch == '-' else '-' for ch in suffix))
                vals['name'] = name[:63].strip('-')
        return super().create(vals_list)

    def write(self, vals):
        spec_fields = set(self._intent_fields) - {'active'}
        if set(vals) & spec_fields and not self.env.context.get('vws_internal'):
            for rec in self:
                ack = rec._ack()
                if ack and ack.ack_outcome in ('applied', 'unchanged'):
                    raise UserError("Operation %s/%s was already created on the cluster: Operations are immutable, "
                                    "declare a new one" % (rec.namespace, rec.name))
        return super().write(vals)

    @api.constrains('name', 'namespace', 'request_id', 'not_before', 'deadline', 'payload_json',
                    'spec_extra_json', 'application_name')
    def _check_operation(self):
        for rec in self:
            if not rec.name or len(rec.name) > 63:
                raise ValidationError("%r: an Operation's name has 1 to 63 characters" % rec.name)
            if not P.DNS_LABEL_RE.match(rec.namespace or '') or len(rec.namespace) > 63:
                raise ValidationError("%r: a namespace must be a DNS label" % rec.namespace)
            if not P.DNS_LABEL_RE.match(rec.application_name or ''):
                raise ValidationError("%r: the application's name must be a DNS-1123 label" % rec.application_name)
            if not P.REQUEST_ID_RE.match(rec.request_id or '') or len(rec.request_id) > 128:
                raise ValidationError("%r: a request id has 1-128 of [-A-Za-z0-9_.:], starting and ending "
                                      "with an alphanumeric" % rec.request_id)
            if rec.not_before and rec.deadline and rec.deadline < rec.not_before + timedelta(seconds=1):
                raise ValidationError("The deadline must be later than 'not before' by at least a second")
            _json_field_check(rec, 'payload_json', dict, 'Payload')
            _json_field_check(rec, 'spec_extra_json', dict, 'More spec')

    def _drop_contradicting_intent(self):
        for rec in self.filtered('active'):
            self.env['vworkspace.deletion'].search([
                ('cluster_id', '=', rec.cluster_id.id), ('kind', '=', self._kind),
                ('namespace', '=', rec.namespace), ('name', '=', rec.name)]).write({'active': False})

    def _spec(self):
        """The Operation spec sent (docs/api/operation.md)."""
        self.ensure_one()
        spec = {'type': self.op_type, 'applicationRef': {'name': self.application_name}, 'requestId': self.request_id}
        if self.not_before:
            spec['notBefore'] = P.rfc3339(self.not_before)
        if self.deadline:
            spec['deadline'] = P.rfc3339(self.deadline)
        if self.urgent:
            spec['urgent'] = True
        payload = P.loads(self.payload_json) if self.payload_json else None
        if self.op_type == 'Restore' and self.restore_verify:
            payload = dict(payload or {}, verify=True)
        if payload is None and self.op_type in ('Rollback',):
            payload = {}
        if payload is not None:
            spec[self.op_type.lower()] = payload
        return P.deep_merge(spec, P.loads(self.spec_extra_json, {}))

    @api.model
    def _vals_from_spec(self, spec):
        spec = copy.deepcopy(spec)
        vals = {}
        if spec.get('type') in dict(OP_TYPES):
            vals['op_type'] = spec.pop('type')
        ref = spec.get('applicationRef')
        if isinstance(ref, dict) and isinstance(ref.get('name'), str):
            vals['application_name'] = ref.pop('name')
            if not ref:
                spec.pop('applicationRef')
        if isinstance(spec.get('requestId'), str):
            vals['request_id'] = spec.pop('requestId')
        for key, fname in (('notBefore', 'not_before'), ('deadline', 'deadline')):
            dt = P.parse_timestamp(spec.get(key))
            if dt and P.rfc3339(dt) == spec[key]:
                vals[fname] = dt
                spec.pop(key)
            else:
                vals[fname] = False
        if spec.get('urgent') is True:
            vals['urgent'] = spec.pop('urgent')
        op_type = vals.get('op_type')
        if op_type and isinstance(spec.get(op_type.lower()), dict):
            payload = spec.pop(op_type.lower())
            if op_type == 'Restore' and payload.get('verify') is True:
                vals['restore_verify'] = True
                payload.pop('verify')
            if payload or op_type != 'Rollback':
                vals['payload_json'] = P.dumps(payload)
        vals['spec_extra_json'] = P.dumps(spec) if spec else False
        return vals

    @api.depends(*_intent_fields)
    def _compute_spec_json(self):
        for rec in self:
            try:
                rec.spec_json = P.dumps(rec._spec()) if rec.op_type and rec.request_id else False
            except ValueError as exc:
                rec.spec_json = "invalid: %s" % exc

    def _min_version(self):
        return P.operation_min_version(self._spec())

    def _document_entry(self):
        return {'namespace': self.namespace, 'name': self.name, 'spec': self._spec()}

    def _sent(self):
        """Sent until acknowledged (then dropping it from the document never deletes it)."""
        ack = self._ack()
        return not (ack and ack.ack_outcome in OPERATION_DONE)

    def action_verify_backup(self):
        """'Verify this backup': a Restore with verify: true from this Backup (1.3)."""
        ops = self.env['vworkspace.operation']
        for rec in self:
            if rec.op_type != 'Backup':
                raise UserError("Only a Backup can be verified")
            ops |= self.create({
                'cluster_id': rec.cluster_id.id, 'namespace': rec.namespace,
                'application_name': rec.application_name, 'op_type': 'Restore',
                'payload_json': P.dumps({'source': {'operationName': rec.name}}), 'restore_verify': True,
            })
        if len(ops) == 1:
            return {'type': 'ir.actions.act_window', 'res_model': 'vworkspace.operation', 'res_id': ops.id,
                    'view_mode': 'form', 'target': 'current'}
        return True

    def action_delete_on_cluster(self):
        for rec in self:
            report = rec._latest_report()
            self.env['vworkspace.deletion'].create({
                'cluster_id': rec.cluster_id.id, 'kind': self._kind, 'namespace': rec.namespace,
                'name': rec.name, 'uid': report.uid if report and report.state != 'deleted' else False,
                'reason': "deleted in Odoo by %s" % self.env.user.name,
            })
        return True


class VworkspaceDeletion(models.Model):
    _name = 'vworkspace.deletion'
    _description = 'vWorkspace deletion (explicit intent)'
    _inherit = ['vworkspace.intent.mixin']
    _order = 'id desc'
    _intent_fields = VworkspaceIntentMixin._intent_fields + ('kind', 'uid', 'reason')

    _key_uniq = models.UniqueIndex('(cluster_id, kind, namespace, name) WHERE active',
                                   'That object already has a deletion on this cluster.')

    kind = fields.Selection([('ApplicationInstance', 'ApplicationInstance'), ('Operation', 'Operation')],
                            required=True, default='ApplicationInstance')
    uid = fields.Char('UID', help="Delete only the object with this UID (the one last reported)")
    reason = fields.Char(help="At most 1024 characters; kept in the acknowledgement and the agent's log")

    def _kind_of(self):
        return self.kind

    @api.constrains('reason', 'namespace')
    def _check_deletion(self):
        for rec in self:
            if rec.reason and len(rec.reason) > P.MAX_REASON:
                raise ValidationError("A deletion's reason has at most 1024 characters")
            if not P.DNS_LABEL_RE.match(rec.namespace or ''):
                raise ValidationError("%r: a namespace must be a DNS label" % rec.namespace)

    def _drop_contradicting_intent(self):
        for rec in self.filtered('active'):
            model = 'vworkspace.application' if rec.kind == 'ApplicationInstance' else 'vworkspace.operation'
            self.env[model].search([('cluster_id', '=', rec.cluster_id.id), ('namespace', '=', rec.namespace),
                                    ('name', '=', rec.name)]).write({'active': False})

    def _document_entry(self):
        entry = {'kind': self.kind, 'namespace': self.namespace, 'name': self.name}
        if self.uid:
            entry['uid'] = self.uid
        if self.reason:
            entry['reason'] = self.reason
        return entry

    def _sent(self):
        """Kept until acknowledged deleted or absent (protocol.md, "The desired-state document")."""
        ack = self._ack()
        return not (ack and ack.ack_outcome in DELETION_DONE)
