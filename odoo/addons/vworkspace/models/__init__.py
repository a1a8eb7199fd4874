# Part of vworkspace-operator. License LGPL-3.
from . import intent
from . import status
from . import cluster
