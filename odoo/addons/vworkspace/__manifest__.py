# Part of vworkspace-operator. License LGPL-3.
{
    'name': 'vWorkspace control plane',
    'version': '19.0.1.5.0',
    'summary': "Odoo's side of the vWorkspace control-plane protocol 1.5 (agent_register, agent_sync)",
    'description': """
The control plane of vWorkspace clusters: one record per Kubernetes cluster, its bot user and
API key, the applications and Operations declared for it, and what its agent acknowledged and
reported. The agent calls ``vworkspace.cluster/agent_register`` and ``agent_sync`` over Odoo's
JSON-2 API (docs/connectivity/protocol.md and docs/connectivity/odoo-addon.md of the
vworkspace-operator repository).
""",
    'category': 'Technical',
    'author': 'vworkspace-operator',
    'license': 'LGPL-3',
    'depends': ['base', 'rpc', 'web'],
    'data': [
        'security/vworkspace_security.xml',
        'security/ir.model.access.csv',
        'data/vworkspace_data.xml',
        'views/cluster_views.xml',
        'views/intent_views.xml',
        'views/status_views.xml',
        'views/menus.xml',
    ],
    'installable': True,
    'application': True,
}
