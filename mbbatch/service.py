"""(Temporary: the token-level wrapper's old import path of :mod:`mbbatch.lengths`.)"""

from .lengths import *  # noqa: F401,F403
from .lengths import ServiceSpec, as_service  # noqa: F401
