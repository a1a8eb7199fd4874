# Part of vworkspace-operator. License LGPL-3.
from . import test_golden
from . import test_protocol
from . import test_http
from . import test_concurrency
