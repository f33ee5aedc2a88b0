"""``python -m durability.build``: the deployment check of a Worker project (see the package)."""

import sys

from . import main

sys.exit(main())
