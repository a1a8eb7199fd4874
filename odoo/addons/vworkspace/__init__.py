# Part of vworkspace-operator. License LGPL-3.
from . import exceptions
from . import models
