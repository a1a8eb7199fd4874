# Part of vworkspace-operator. License LGPL-3.
"""``vworkspace.cluster``: one Kubernetes cluster, its bot user and key, and the two methods
its agent calls over JSON-2 (docs/connectivity/protocol.md)."""
import logging
import secrets
from datetime import timedelta

from odoo import Command, api, fields, models
from odoo.exceptions import AccessError, UserError, ValidationError
from odoo.tools import SQL

from .. import protocol as P
from ..exceptions import ClusterMismatch, ClusterNotRegistered, InvalidParams

_logger = logging.getLogger(__name__)

ACKS_KEPT = 100  # acknowledgements kept per cluster (the intent records keep their own latest entry)
OFFLINE_INTERVALS = 3  # protocol.md, "Reading status in Odoo": offline after about 3 sync intervals

# Written by the protocol (or the cluster's own actions) only, never through write() by a person.
PROTOCOL_FIELDS = frozenset((
    'bot_user_id', 'bound_uid', 'registered_at', 'last_seen', 'reported_name', 'agent_version',
    'agent_instance', 'agent_mode', 'agent_started_at', 'agent_protocol_version', 'capabilities',
    'allowed_namespaces', 'epoch', 'past_epochs', 'revision', 'resync_requested', 'resync_id',
    'resync_next_batch', 'resync_broken', 'resync_serial', 'resync_completed_at', 'resyncs_completed',
    'syncs', 'last_error_json', 'last_error_reason', 'last_error_message', 'last_error_since',
    'last_error_attempts', 'last_error_received_at',
))


class VworkspaceCluster(models.Model):
    _name = 'vworkspace.cluster'
    _description = 'vWorkspace cluster'
    _order = 'name'

    _name_uniq = models.Constraint('UNIQUE (name)', 'A cluster of that name exists already.')
    _bot_uniq = models.Constraint('UNIQUE (bot_user_id)', 'A bot user belongs to one cluster.')
    _limit_range = models.Constraint(
        'CHECK (max_reports_per_sync >= 1 AND max_reports_per_sync <= 500)',
        'The report limit is 1 to 500 reports per call.')
    _interval_range = models.Constraint(
        'CHECK (sync_interval_seconds >= 5 AND sync_interval_seconds <= 3600)',
        'The sync interval is 5 to 3600 seconds.')

    name = fields.Char(required=True, help="The record's name in Odoo (the owner's cluster name may differ)")
    active = fields.Boolean(default=True)
    organisation_id = fields.Many2one('res.partner', string='Organisation')
    bot_user_id = fields.Many2one('res.users', string='Bot user', readonly=True, copy=False, ondelete='restrict',
                                  help="The user the agent's API key belongs to; it sees this cluster only")
    bound_uid = fields.Char('Bound cluster UID', readonly=True, copy=False,
                            help="metadata.uid of the cluster's kube-system namespace, bound at the first "
                                 "agent_register; clear it (Unbind) to rebind a rebuilt cluster")
    registered_at = fields.Datetime(readonly=True, copy=False)
    last_seen = fields.Datetime(readonly=True, copy=False, help="Last successful call of the agent")
    reported_name = fields.Char('Name on the cluster', readonly=True, copy=False)
    agent_version = fields.Char(readonly=True, copy=False)
    agent_instance = fields.Char(readonly=True, copy=False)
    agent_mode = fields.Char(readonly=True, copy=False)
    agent_started_at = fields.Datetime(readonly=True, copy=False)
    agent_protocol_version = fields.Char('Agent protocol', readonly=True, copy=False,
                                         help="protocol_version of the last agent_register: what Odoo may send")
    capabilities = fields.Char(readonly=True, copy=False)
    allowed_namespaces = fields.Char("Agent's allowed namespaces", readonly=True, copy=False,
                                     help="The cluster owner's allow-list (Odoo cannot change it)")

    epoch = fields.Char(readonly=True, copy=False)
    past_epochs = fields.Text(readonly=True, copy=False)
    revision = fields.Integer(readonly=True, copy=False, default=0)
    max_reports_per_sync = fields.Integer('Reports per sync (limit)', default=P.DEFAULT_MAX_REPORTS, required=True)
    sync_interval_seconds = fields.Integer('Sync interval (s)', default=30, required=True)
    key_days = fields.Integer('API key lifetime (days)', default=90, required=True)
    key_rotation_grace_minutes = fields.Integer(
        'Old key valid after rotation (min)', default=60, required=True,
        help="Rotation creates a new key and lets the old ones expire after this long (0: at once)")

    resync_requested = fields.Boolean(readonly=True, copy=False,
                                      help="Odoo asks the agent for a full resync (cleared when one starts)")
    resync_id = fields.Char(readonly=True, copy=False)
    resync_next_batch = fields.Integer(readonly=True, copy=False)
    resync_broken = fields.Boolean(readonly=True, copy=False)
    resync_serial = fields.Integer(readonly=True, copy=False)
    resync_completed_at = fields.Datetime('Last full resync', readonly=True, copy=False)
    resyncs_completed = fields.Integer(readonly=True, copy=False)
    syncs = fields.Integer(readonly=True, copy=False)

    last_error_json = fields.Text('Last agent error (as sent)', readonly=True, copy=False)
    last_error_reason = fields.Char(readonly=True, copy=False)
    last_error_message = fields.Char(readonly=True, copy=False)
    last_error_since = fields.Datetime(readonly=True, copy=False)
    last_error_attempts = fields.Integer(readonly=True, copy=False)
    last_error_received_at = fields.Datetime(readonly=True, copy=False)

    application_ids = fields.One2many('vworkspace.application', 'cluster_id', string='Applications')
    operation_ids = fields.One2many('vworkspace.operation', 'cluster_id', string='Operations')
    deletion_ids = fields.One2many('vworkspace.deletion', 'cluster_id', string='Deletions')
    report_ids = fields.One2many('vworkspace.report', 'cluster_id', string='Reports', readonly=True)
    ack_ids = fields.One2many('vworkspace.ack', 'cluster_id', string='Acknowledgements', readonly=True)

    agent_online = fields.Boolean(compute='_compute_agent_online')
    status = fields.Selection([('never', 'Never seen'), ('online', 'Online'), ('offline', 'Offline'),
                               ('unbound', 'Not registered')], compute='_compute_agent_online')
    acknowledged_revision = fields.Integer(compute='_compute_acknowledged')
    intent_acknowledged = fields.Boolean('In sync', compute='_compute_acknowledged')
    api_keys = fields.Text('API keys of the bot', compute='_compute_api_keys')
    application_count = fields.Integer(compute='_compute_counts')
    operation_count = fields.Integer(compute='_compute_counts')

    # -- computed -------------------------------------------------------------------------

    @api.depends('last_seen', 'sync_interval_seconds', 'bound_uid')
    def _compute_agent_online(self):
        now = fields.Datetime.now()
        for rec in self:
            limit = timedelta(seconds=OFFLINE_INTERVALS * (rec.sync_interval_seconds or 30))
            rec.agent_online = bool(rec.last_seen and now - rec.last_seen <= limit)
            if not rec.bound_uid:
                rec.status = 'unbound'
            elif not rec.last_seen:
                rec.status = 'never'
            else:
                rec.status = 'online' if rec.agent_online else 'offline'

    @api.depends('revision', 'epoch', 'ack_ids')
    def _compute_acknowledged(self):
        for rec in self:
            ack = self.env['vworkspace.ack'].sudo().search(
                [('cluster_id', '=', rec.id), ('epoch', '=', rec.epoch), ('outcome', 'in', ('applied', 'refused'))],
                order='revision desc', limit=1) if rec.id else None
            rec.acknowledged_revision = ack.revision if ack else 0
            rec.intent_acknowledged = rec.revision == 0 or bool(ack and ack.revision == rec.revision)

    def _compute_api_keys(self):
        for rec in self:
            if not rec.bot_user_id or not self.env.user.has_group('vworkspace.group_vworkspace_manager'):
                rec.api_keys = False
                continue
            keys = self.env['res.users.apikeys'].sudo().search([('user_id', '=', rec.bot_user_id.id)],
                                                               order='id')
            rec.api_keys = '\n'.join(
                "%s (scope %s), created %s, expires %s" % (
                    k.name, k.scope or 'any', P.rfc3339(k.create_date), P.rfc3339(k.expiration_date) or 'never')
                for k in keys) or "no key"

    def _compute_counts(self):
        for rec in self:
            rec.application_count = len(rec.application_ids)
            rec.operation_count = len(rec.operation_ids)

    # -- life cycle -----------------------------------------------------------------------

    @api.model_create_multi
    def create(self, vals_list):
        for vals in vals_list:
            if PROTOCOL_FIELDS & set(vals) and not self.env.context.get('vws_internal'):
                raise UserError("%s: written by the protocol only" % ', '.join(sorted(PROTOCOL_FIELDS & set(vals))))
        records = super().create(vals_list)
        group = self.env.ref('vworkspace.group_vworkspace_agent')
        for rec in records:
            bot = self.env['res.users'].sudo().with_context(no_reset_password=True).create({
                'name': "vWorkspace agent: %s" % rec.name,
                'login': "vworkspace-agent-%d-%s" % (rec.id, secrets.token_hex(4)),
                'group_ids': [Command.set([group.id])],
            })
            rec.with_context(vws_internal=True).write({
                'bot_user_id': bot.id,
                'epoch': P.new_epoch('c%d' % rec.id),
                'revision': 0,
            })
        return records

    def write(self, vals):
        if PROTOCOL_FIELDS & set(vals) and not self.env.context.get('vws_internal'):
            raise UserError("%s: written by the protocol only" % ', '.join(sorted(PROTOCOL_FIELDS & set(vals))))
        res = super().write(vals)
        if 'active' in vals:
            self.bot_user_id.sudo().write({'active': vals['active']})
        if 'name' in vals:
            for rec in self.filtered('bot_user_id'):
                rec.bot_user_id.sudo().name = "vWorkspace agent: %s" % rec.name
        return res

    def unlink(self):
        bots = self.bot_user_id
        self._revoke_keys()
        res = super().unlink()
        bots.sudo().write({'active': False})
        return res

    # -- revisions and epochs -------------------------------------------------------------

    def _lock(self):
        """Lock the cluster's row until the transaction ends: two calls of one cluster (the
        agent's, a person's change of intent) run one after the other. A call that waited
        for a concurrent one that changed the row then fails with a serialisation error,
        which Odoo retries (odoo/service/model.py, ``retrying``)."""
        self.ensure_one()
        self.flush_recordset()
        self.env.cr.execute(SQL("SELECT id FROM vworkspace_cluster WHERE id = %s FOR UPDATE", self.id))
        self.invalidate_recordset()

    def _bump_revision(self, at_least=0):
        """Increase the revision (in the same transaction as the change of intent)."""
        self.ensure_one()
        self._lock()
        revision = max(self.revision, at_least) + 1
        # Whoever may change intent moves the cursor (a User has no write right on clusters).
        self.sudo().with_context(vws_internal=True).write({'revision': revision})
        return revision

    def _known_epochs(self):
        self.ensure_one()
        return [self.epoch] + (self.past_epochs or '').split()

    def _start_new_epoch(self, at_least=0):
        """A new epoch, never used before (rule 6), and a revision above any seen."""
        self.ensure_one()
        self._lock()
        past = ' '.join(([self.epoch] if self.epoch else []) + (self.past_epochs or '').split()[:63])
        self.with_context(vws_internal=True).write({
            'past_epochs': past,
            'epoch': P.new_epoch('c%d' % self.id),
            'resync_requested': True,
        })
        return self._bump_revision(at_least)

    def _agent_version(self):
        """What Odoo may send: the lower of the agent's last announced version and ours
        (None: never registered)."""
        self.ensure_one()
        try:
            announced = P.parse_version(self.agent_protocol_version)
        except InvalidParams:
            return None
        return min(announced, P.PROTOCOL_VERSION)

    def _held_entries(self):
        self.ensure_one()
        return sorted((r._name, r.id) for r in list(self.application_ids) + list(self.operation_ids) if r._held())

    def _document(self, now):
        """The desired-state document at the current cursor (None at revision 0)."""
        self.ensure_one()
        if not self.revision:
            return None
        apps = self.application_ids.sorted(lambda r: (r.namespace, r.name, r.id))
        ops = self.operation_ids.sorted(lambda r: (r.namespace, r.name, r.id))
        dels = self.deletion_ids.sorted(lambda r: (r.kind, r.namespace, r.name, r.id))
        return {
            'epoch': self.epoch,
            'revision': self.revision,
            'generated_at': P.rfc3339(now),
            'applications': [a._document_entry() for a in apps if not a._held()],
            'operations': [o._document_entry() for o in ops if not o._held() and o._sent()],
            'deletions': [d._document_entry() for d in dels if d._sent()],
        }

    def _report_limit(self):
        return max(1, min(self.max_reports_per_sync or P.DEFAULT_MAX_REPORTS, P.MAX_REPORTS_CAP))

    # -- the protocol ---------------------------------------------------------------------

    @api.model
    def _agent_cluster(self):
        """The cluster of the key's user (never from a parameter)."""
        self.browse().check_access('read')
        cluster = self.search([('bot_user_id', '=', self.env.uid)], limit=1)
        if not cluster:
            raise AccessError("user %s is not the agent of any vWorkspace cluster" % self.env.user.login)
        return cluster.sudo()

    def _mismatch(self):
        return ClusterMismatch("this API key belongs to cluster %s (uid %s)" % (self.name, self.bound_uid))

    @api.model
    def agent_register(self, protocol_version, cluster, agent, allowed_namespaces, capabilities=None, **kwargs):
        """The agent starts (or got 401, ClusterNotRegistered, ClusterMismatch): bind the
        cluster UID at the first call, refuse another one after; store what the agent says
        about itself (protocol.md, "agent_register")."""
        P.check_version(protocol_version, 'agent_register', kwargs)
        rec = self._agent_cluster()
        P.check_dict(cluster, 'cluster')
        uid = P.check_str(cluster.get('uid'), 'cluster.uid')
        name = P.check_str(cluster.get('name'), 'cluster.name', optional=True, empty=True)
        P.check_dict(agent, 'agent')
        namespaces = P.check_list(allowed_namespaces, 'allowed_namespaces')
        for i, ns in enumerate(namespaces):
            P.check_str(ns, 'allowed_namespaces[%d]' % i)
        caps = P.check_list(capabilities, 'capabilities', optional=True)
        for i, cap in enumerate(caps):
            P.check_str(cap, 'capabilities[%d]' % i)

        rec._lock()
        if rec.bound_uid and rec.bound_uid != uid:
            raise rec._mismatch()
        now = fields.Datetime.now()
        held_before = rec._held_entries()
        str_or = lambda v: v if isinstance(v, str) else False  # noqa: E731
        rec.with_context(vws_internal=True).write({
            'bound_uid': uid,
            'registered_at': rec.registered_at or now,
            'last_seen': now,
            'reported_name': name or False,
            'agent_version': str_or(agent.get('version')),
            'agent_instance': str_or(agent.get('instance')),
            'agent_mode': str_or(agent.get('mode')),
            'agent_started_at': P.parse_timestamp(agent.get('started_at')) or False,
            'agent_protocol_version': protocol_version,
            'allowed_namespaces': ', '.join(namespaces),
            'capabilities': ', '.join(caps) or False,
        })
        if rec._held_entries() != held_before:
            # What the document holds for this agent changed, the cursor must move too.
            rec._bump_revision()
        return {
            'protocol_version': P.PROTOCOL_VERSION_STR,
            'cluster_id': rec.id,
            'server_time': P.rfc3339(now),
            'sync_interval_seconds': rec.sync_interval_seconds,
            'max_reports_per_sync': rec._report_limit(),
        }

    @api.model
    def agent_sync(self, protocol_version, cluster_uid, agent_instance, known=None, acks=(), reports=(),
                   resync=None, more=False, last_error=None, **kwargs):
        """Acknowledgements and reports up, the desired state down when it changed, all in
        this call's one transaction (protocol.md, "agent_sync")."""
        P.check_version(protocol_version, 'agent_sync', kwargs)
        rec = self._agent_cluster()
        P.check_str(cluster_uid, 'cluster_uid')
        P.check_str(agent_instance, 'agent_instance', empty=True)
        rec._lock()
        if not rec.bound_uid:
            raise ClusterNotRegistered("call agent_register first")
        if cluster_uid != rec.bound_uid:
            raise rec._mismatch()

        if known is not None:
            P.check_dict(known, 'known')
            P.check_str(known.get('epoch'), 'known.epoch')
            P.check_int(known.get('revision'), 'known.revision', minimum=0)
        acks = P.check_list(acks, 'acks', optional=True)
        for i, ack in enumerate(acks):
            P.check_dict(ack, 'acks[%d]' % i)
            P.check_str(ack.get('epoch'), 'acks[%d].epoch' % i)
            P.check_int(ack.get('revision'), 'acks[%d].revision' % i, minimum=0)
            for j, obj in enumerate(P.check_list(ack.get('objects'), 'acks[%d].objects' % i, optional=True)):
                P.check_object_key(obj, 'acks[%d].objects[%d]' % (i, j))
        reports = P.check_list(reports, 'reports', optional=True)
        limit = rec._report_limit()
        if len(reports) > limit:
            raise InvalidParams("reports: at most %d reports per call (got %d)" % (limit, len(reports)))
        for i, report in enumerate(reports):
            P.check_object_key(report, 'reports[%d]' % i)
        if resync is not None:
            P.check_dict(resync, 'resync')
            P.check_str(resync.get('id'), 'resync.id')
            P.check_int(resync.get('batch'), 'resync.batch', minimum=0)
            P.check_bool(resync.get('last_batch'), 'resync.last_batch')
        P.check_bool(more, 'more')
        if last_error is not None:
            P.check_dict(last_error, 'last_error')

        now = fields.Datetime.now()
        for ack in acks:
            rec._store_ack(ack, now)
        serial = rec._resync_marker(resync) if resync is not None else None
        rec._store_reports(reports, serial, now)
        if resync is not None and resync.get('last_batch') and serial is not None:
            rec._sweep(serial, now)

        vals = {'last_seen': now, 'syncs': rec.syncs + 1, 'agent_instance': agent_instance or rec.agent_instance}
        if last_error is not None:
            attempts = last_error.get('attempts')
            vals.update({
                'last_error_json': P.dumps(last_error),
                'last_error_reason': last_error.get('reason') if isinstance(last_error.get('reason'), str) else False,
                'last_error_message': (last_error.get('message') if isinstance(last_error.get('message'), str)
                                       else False),
                'last_error_since': P.parse_timestamp(last_error.get('since')) or False,
                'last_error_attempts': attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
                'last_error_received_at': now,
            })
        rec.with_context(vws_internal=True).write(vals)

        if known is not None:
            rec._check_known(known)
        result = {
            'protocol_version': P.PROTOCOL_VERSION_STR,
            'server_time': P.rfc3339(now),
            'resync_requested': bool(rec.resync_requested),
            'next_sync_seconds': rec.sync_interval_seconds,
            'max_reports_per_sync': limit,
        }
        if known is None or (known.get('epoch'), known.get('revision')) != (rec.epoch, rec.revision):
            document = rec._document(now)
            if document is not None:
                result['desired'] = document
        return result

    def _check_known(self, known):
        """The agent's cursor says Odoo's went back (its database was restored from a
        backup): start a new epoch above it, and ask for a full resync (protocol.md,
        "Questions a module author asks")."""
        epoch, revision = known['epoch'], known['revision']
        if epoch == self.epoch and revision > self.revision:
            why = "the agent knows revision %d of epoch %s, Odoo only %d" % (revision, epoch, self.revision)
        elif epoch != self.epoch and epoch not in self._known_epochs():
            why = "the agent knows epoch %s, which Odoo does not have" % epoch
        else:
            return
        _logger.warning("vworkspace cluster %s: %s (a database restore?): new epoch", self.name, why)
        self._start_new_epoch(at_least=revision)

    def _store_ack(self, ack, now):
        """The latest acknowledgement per epoch and revision (replacing an earlier one), and
        each object's entry on its intent record."""
        Ack = self.env['vworkspace.ack'].sudo()
        epoch, revision = ack['epoch'], ack['revision']
        raw = P.dumps(ack)
        existing = Ack.search([('cluster_id', '=', self.id), ('epoch', '=', epoch), ('revision', '=', revision)],
                              limit=1)
        if existing and existing.raw == raw:
            return  # the same acknowledgement again (at least once): nothing changes
        objects = [o for o in ack.get('objects') or []]
        str_or = lambda v: v if isinstance(v, str) else False  # noqa: E731
        vals = {
            'cluster_id': self.id, 'epoch': epoch, 'revision': revision,
            'outcome': str_or(ack.get('outcome')), 'reason': str_or(ack.get('reason')),
            'message': str_or(ack.get('message')), 'processed_at': P.parse_timestamp(ack.get('processed_at')) or False,
            'received_at': now, 'raw': raw,
            'object_ids': [Command.clear()] + [Command.create({
                'cluster_id': self.id, 'epoch': epoch, 'revision': revision, 'sequence': i,
                'kind': o['kind'], 'namespace': o['namespace'], 'name': o['name'],
                'outcome': str_or(o.get('outcome')), 'reason': str_or(o.get('reason')),
                'message': str_or(o.get('message')), 'uid': str_or(o.get('uid')),
                'generation': o['generation'] if isinstance(o.get('generation'), int)
                and not isinstance(o.get('generation'), bool) else 0,
                'conflict': P.dumps(o['conflict']) if o.get('conflict') is not None else False,
            }) for i, o in enumerate(objects)],
        }
        if existing:
            existing.write(vals)
        else:
            Ack.create(vals)
        if epoch in self._known_epochs():
            for obj in objects:
                for intent in self._intent_for(obj['kind'], obj['namespace'], obj['name']):
                    intent._record_ack(obj, epoch, revision)
        old = Ack.search([('cluster_id', '=', self.id)], order='revision desc, id desc', offset=ACKS_KEPT)
        old.unlink()

    def _intent_for(self, kind, namespace, name):
        """The intent records an acknowledgement entry is about (archived ones included: a
        deletion archives the application it deletes)."""
        domain = [('cluster_id', '=', self.id), ('namespace', '=', namespace), ('name', '=', name)]
        found = list(self.env['vworkspace.deletion'].sudo().with_context(active_test=False).search(
            domain + [('kind', '=', kind)]))
        model = {'ApplicationInstance': 'vworkspace.application', 'Operation': 'vworkspace.operation'}.get(kind)
        if model:
            found += list(self.env[model].sudo().with_context(active_test=False).search(domain))
        return found

    def _resync_marker(self, marker):
        """Apply a resync marker; the serial of the resync the reports belong to, or None
        when this one is abandoned (out of order: no sweep, a new resync is asked for)."""
        rid, batch = marker['id'], marker['batch']
        if batch == 0:
            serial = self.resync_serial + 1
            self.with_context(vws_internal=True).write({
                'resync_id': rid, 'resync_next_batch': 1, 'resync_broken': False, 'resync_serial': serial,
                'resync_requested': False,
            })
            return serial
        if (rid == self.resync_id and batch == self.resync_next_batch and not self.resync_broken):
            self.with_context(vws_internal=True).write({'resync_next_batch': batch + 1})
            return self.resync_serial
        _logger.info("vworkspace cluster %s: resync %s batch %d out of order (expected %s batch %d): abandoned",
                     self.name, rid, batch, self.resync_id, self.resync_next_batch)
        self.with_context(vws_internal=True).write({
            'resync_id': rid, 'resync_broken': True, 'resync_requested': True})
        return None

    def _store_reports(self, reports, serial, now):
        """The latest report per object (kind, namespace, name): a report replaces the stored
        one, except a late duplicate (the same uid, a smaller resource_version)."""
        if not reports:
            return
        Report = self.env['vworkspace.report'].sudo()
        stored = {(r.kind, r.namespace, r.name): r for r in Report.search([('cluster_id', '=', self.id)])}
        for report in reports:
            key = (report['kind'], report['namespace'], report['name'])
            old = stored.get(key)
            if old:
                new_rv, old_rv = P.as_int(report.get('resource_version')), P.as_int(old.resource_version)
                late = (report.get('uid') and report.get('uid') == old.uid and new_rv is not None
                        and old_rv is not None and new_rv < old_rv)
                same = old.raw == P.dumps(report) and not old.absent_after_resync
                if late or same:
                    if serial is not None and old.resync_serial != serial:
                        old.resync_serial = serial
                    continue
                vals = Report._vals_from_report(report, now)
                if serial is not None:
                    vals['resync_serial'] = serial
                old.write(vals)
            else:
                vals = Report._vals_from_report(report, now)
                vals.update({'cluster_id': self.id, 'kind': key[0], 'namespace': key[1], 'name': key[2],
                             'resync_serial': serial or 0})
                stored[key] = Report.create(vals)

    def _sweep(self, serial, now):
        """The last batch of a full resync: what no batch mentioned no longer exists."""
        gone = self.env['vworkspace.report'].sudo().search([
            ('cluster_id', '=', self.id), ('resync_serial', '!=', serial), ('state', '!=', 'deleted')])
        gone.write({'state': 'deleted', 'absent_after_resync': True, 'received_at': now})
        self.with_context(vws_internal=True).write({
            'resync_completed_at': now, 'resyncs_completed': self.resyncs_completed + 1,
            # A completed resync takes no more batches: another one starts at batch 0.
            'resync_next_batch': -1})

    # -- actions (buttons) ----------------------------------------------------------------

    def _check_manager(self):
        if not (self.env.su or self.env.user.has_group('vworkspace.group_vworkspace_manager')):
            raise AccessError("Only a vWorkspace manager can do this")

    def _generate_api_key(self, days=None, name=None):
        """A new API key of the bot, scope ``rpc``, expiring in ``days`` (the cluster's
        lifetime by default). Returns the key: it is stored hashed and never shown again.
        odoo/addons/base/models/res_users.py ``ResUsersApikeys._generate`` is private (no
        JSON-2 ``generate`` exists); sudo lifts the per-group limit of the lifetime."""
        self.ensure_one()
        self._check_manager()
        days = days or self.key_days or 90
        expiration = fields.Datetime.now() + timedelta(days=days)
        label = name or "vworkspace agent %s (%s)" % (self.name, P.rfc3339(fields.Datetime.now()))
        return self.env['res.users.apikeys'].with_user(self.bot_user_id).sudo()._generate('rpc', label, expiration)

    def _bot_keys(self):
        return self.env['res.users.apikeys'].sudo().search([('user_id', 'in', self.bot_user_id.ids)], order='id')

    def _revoke_keys(self, keys=None):
        keys = self._bot_keys() if keys is None else keys
        if keys:
            keys._remove()

    def _show_key(self, key):
        return {
            'type': 'ir.actions.act_window',
            'res_model': 'res.users.apikeys.show',
            'name': "API key of %s: put it in the agent's Secret now, it is not shown again" % self.name,
            'views': [(False, 'form')],
            'target': 'new',
            'context': {'default_key': key},
        }

    def action_generate_api_key(self):
        self.ensure_one()
        return self._show_key(self._generate_api_key())

    def action_rotate_api_key(self):
        """Rotation (protocol.md, "Identity, credentials and registration"): a new key now;
        the old ones expire after the grace period, time enough to update the Secret (the
        agent re-reads its key after every 401)."""
        self.ensure_one()
        self._check_manager()
        old = self._bot_keys()
        key = self._generate_api_key()
        self._expire_keys(old, fields.Datetime.now() + timedelta(minutes=self.key_rotation_grace_minutes))
        return self._show_key(key)

    def _expire_keys(self, keys, when):
        if not keys:
            return
        if when <= fields.Datetime.now():
            self._revoke_keys(keys)
            return
        # res.users.apikeys has no ORM write for its expiry (readonly fields of an _auto=False table).
        self.env.cr.execute(SQL(
            "UPDATE res_users_apikeys SET expiration_date = %s WHERE id IN %s "
            "AND (expiration_date IS NULL OR expiration_date > %s)", when, tuple(keys.ids), when))
        keys.invalidate_recordset()

    def action_revoke_api_keys(self):
        """Revocation: every key of the bot stops working at once (the agent gets 401)."""
        self._check_manager()
        self._revoke_keys()
        return True

    def action_unbind(self):
        """Rebinding (the cluster was rebuilt): the next agent_register binds its UID."""
        self._check_manager()
        self.with_context(vws_internal=True).write({'bound_uid': False})
        return True

    def action_request_resync(self):
        self.check_access('read')
        self.sudo().with_context(vws_internal=True).write({'resync_requested': True})
        return True

    def action_new_epoch(self):
        """After restoring Odoo's database from a backup: a new epoch, so that the agent
        takes the next document even if its revision is not above the one it knows."""
        self._check_manager()
        for rec in self:
            rec._start_new_epoch()
        return True

    @api.constrains('key_days', 'key_rotation_grace_minutes')
    def _check_key_settings(self):
        for rec in self:
            if rec.key_days < 1 or rec.key_rotation_grace_minutes < 0:
                raise ValidationError("A key lives at least a day; the grace period is not negative")
