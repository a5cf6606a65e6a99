"""The built-in model zoo (re-exported from `alpaviz.core.models`)."""

from alpaviz.core.models import *  # noqa: F401,F403
from alpaviz.core.models import __all__ as __all__  # noqa: F401
