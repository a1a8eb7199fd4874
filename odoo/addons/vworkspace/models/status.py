# Part of vworkspace-operator. License LGPL-3.
"""What the agent sent up: acknowledgements (latest per epoch and revision) and status
reports (latest per object). Written only by ``agent_sync``; read-only for everyone else."""
from odoo import fields, models

from .. import protocol as P


class VworkspaceReport(models.Model):
    _name = 'vworkspace.report'
    _description = 'vWorkspace status report (latest per object)'
    _order = 'cluster_id, kind, namespace, name'
    _rec_name = 'display_key'

    _key_uniq = models.UniqueIndex('(cluster_id, kind, namespace, name)',
                                   'One report per object and cluster.')

    cluster_id = fields.Many2one('vworkspace.cluster', required=True, ondelete='cascade', index=True,
                                 readonly=True)
    kind = fields.Char(required=True, readonly=True)
    namespace = fields.Char(required=True, readonly=True)
    name = fields.Char(required=True, readonly=True)
    display_key = fields.Char('Object', compute='_compute_display_key')
    uid = fields.Char('UID', readonly=True)
    state = fields.Char(readonly=True, help="As reported (an unknown value is kept as text)")
    generation = fields.Integer(readonly=True)
    observed_generation = fields.Integer(readonly=True)
    resource_version = fields.Char(readonly=True)
    managed_by_agent = fields.Boolean(readonly=True)
    conditions = fields.Text(readonly=True)
    ready_status = fields.Char('Ready', readonly=True)
    ready_reason = fields.Char(readonly=True)
    ready_message = fields.Char(readonly=True)
    ready_since = fields.Datetime(readonly=True, help="The Ready condition's last_transition_time")
    phase = fields.Char(readonly=True)
    result = fields.Text(readonly=True)
    start_time = fields.Datetime(readonly=True)
    completion_time = fields.Datetime(readonly=True)
    request_id = fields.Char(readonly=True)
    deployed_chart_version = fields.Char(readonly=True)
    desired_chart_version = fields.Char(readonly=True)
    backup_schedule = fields.Text(readonly=True)
    verification = fields.Text(readonly=True)
    created_at = fields.Datetime(readonly=True)
    observed_at = fields.Datetime(readonly=True, help="When the agent read this state (display only)")
    received_at = fields.Datetime(readonly=True)
    raw = fields.Text('Report as received', readonly=True)
    absent_after_resync = fields.Boolean(readonly=True,
                                         help="Marked deleted: the last full resync did not mention it")
    resync_serial = fields.Integer(readonly=True, help="The full resync that last mentioned it")

    def _compute_display_key(self):
        for rec in self:
            rec.display_key = '%s/%s/%s' % (rec.kind, rec.namespace, rec.name)

    def _vals_from_report(self, report, now):
        conditions = report.get('conditions') if isinstance(report.get('conditions'), list) else []
        ready = next((c for c in conditions if isinstance(c, dict) and c.get('type') == 'Ready'), {})

        def text(key):
            v = report.get(key)
            return v if isinstance(v, str) else (False if v is None else str(v))

        def integer(key):
            v = report.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) else 0

        def obj(key):
            v = report.get(key)
            return P.dumps(v) if v is not None else False

        return {
            'uid': text('uid'),
            'state': text('state'),
            'generation': integer('generation'),
            'observed_generation': integer('observed_generation'),
            'resource_version': text('resource_version'),
            'managed_by_agent': report.get('managed_by_agent') is True,
            'conditions': P.dumps(conditions),
            'ready_status': ready.get('status') or False,
            'ready_reason': ready.get('reason') or False,
            'ready_message': ready.get('message') or False,
            'ready_since': P.parse_timestamp(ready.get('last_transition_time')) or False,
            'phase': text('phase'),
            'result': text('result'),
            'start_time': P.parse_timestamp(report.get('start_time')) or False,
            'completion_time': P.parse_timestamp(report.get('completion_time')) or False,
            'request_id': text('request_id'),
            'deployed_chart_version': text('deployed_chart_version'),
            'desired_chart_version': text('desired_chart_version'),
            'backup_schedule': obj('backup_schedule'),
            'verification': obj('verification'),
            'created_at': P.parse_timestamp(report.get('created_at')) or False,
            'observed_at': P.parse_timestamp(report.get('observed_at')) or False,
            'received_at': now,
            'raw': P.dumps(report),
            'absent_after_resync': False,
        }


class VworkspaceAck(models.Model):
    _name = 'vworkspace.ack'
    _description = 'vWorkspace acknowledgement of a document'
    _order = 'cluster_id, revision desc, id desc'
    _rec_name = 'display_key'

    _cursor_uniq = models.UniqueIndex('(cluster_id, epoch, revision)',
                                      'One acknowledgement per cluster, epoch and revision.')

    cluster_id = fields.Many2one('vworkspace.cluster', required=True, ondelete='cascade', index=True,
                                 readonly=True)
    epoch = fields.Char(required=True, readonly=True)
    revision = fields.Integer(required=True, readonly=True)
    display_key = fields.Char('Document', compute='_compute_display_key')
    outcome = fields.Char(readonly=True, help="applied, incomplete, refused (an unknown value is kept as text)")
    reason = fields.Char(readonly=True)
    message = fields.Text(readonly=True)
    processed_at = fields.Datetime(readonly=True)
    received_at = fields.Datetime(readonly=True)
    raw = fields.Text('Acknowledgement as received', readonly=True)
    object_ids = fields.One2many('vworkspace.ack.object', 'ack_id', string='Objects', readonly=True)

    def _compute_display_key(self):
        for rec in self:
            rec.display_key = '%s/%s' % (rec.epoch, rec.revision)


class VworkspaceAckObject(models.Model):
    _name = 'vworkspace.ack.object'
    _description = 'vWorkspace acknowledgement entry of one object'
    _order = 'ack_id, sequence'

    _lookup_idx = models.Index('(cluster_id, kind, namespace, name, revision)')

    ack_id = fields.Many2one('vworkspace.ack', required=True, ondelete='cascade', index=True, readonly=True)
    cluster_id = fields.Many2one('vworkspace.cluster', required=True, ondelete='cascade', readonly=True)
    epoch = fields.Char(required=True, readonly=True)
    revision = fields.Integer(required=True, readonly=True)
    sequence = fields.Integer(readonly=True)
    kind = fields.Char(readonly=True)
    namespace = fields.Char(readonly=True)
    name = fields.Char(readonly=True)
    outcome = fields.Char(readonly=True)
    reason = fields.Char(readonly=True)
    message = fields.Text(readonly=True)
    uid = fields.Char('UID', readonly=True)
    generation = fields.Integer(readonly=True)
    conflict = fields.Text(readonly=True, help="For outcome conflict: who owns spec.chart.version and spec.values")
