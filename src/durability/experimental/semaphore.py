"""durability.experimental.semaphore: the semaphore under the specification's experimental entry point.

Lives here: nothing new; the names of ``durability.semaphore``, which keeps
working. Import from here to say you depend on an API that may change in a
minor release (see ``durability.experimental``). Must not know: anything
``durability.semaphore`` does not export.
"""

from ..semaphore import *  # noqa: F401,F403  (the same public names)
from ..semaphore import __all__  # noqa: F401
