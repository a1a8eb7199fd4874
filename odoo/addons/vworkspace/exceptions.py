# Part of vworkspace-operator. License LGPL-3.
"""The errors of the vWorkspace protocol (docs/connectivity/protocol.md, "Errors").

JSON-2 answers an exception with ``name`` = ``<module>.<class>`` (odoo/http.py,
``serialize_exception``), so these classes must stay in this module, whose import path is
``odoo.addons.vworkspace.exceptions``, and keep their names: the agent tells them apart by
``name``. The HTTP status is the parent class's ``http_status`` (odoo/exceptions.py;
odoo/http.py ``Json2Dispatcher.handle_error``).
"""
from odoo.exceptions import AccessDenied, MissingError, UserError, ValidationError


class ClusterMismatch(AccessDenied):
    """403: the call carries another cluster UID than the one bound to the key's record."""

    def __init__(self, message):
        super().__init__(message)


class ClusterNotRegistered(MissingError):
    """404: ``agent_sync`` while no cluster UID is bound (never registered, or unbound)."""


class ProtocolVersionMismatch(UserError):
    """422: another MAJOR protocol version (or a parameter this version does not have)."""


class InvalidParams(ValidationError):
    """422: a parameter breaks a rule of the protocol (too many reports, wrong types...)."""
