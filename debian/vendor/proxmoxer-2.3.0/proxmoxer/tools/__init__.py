__author__ = "John Hollowell"
__copyright__ = "(c) John Hollowell 2022"
__license__ = "MIT"

from . import *  # noqa: F401 F403
from .files import *  # noqa: F401 F403
from .tasks import *  # noqa: F401 F403
