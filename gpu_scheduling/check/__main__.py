"""``python -m gpu_scheduling.check``: the same as the ``gpu-scheduler-check`` console script."""

import sys

from gpu_scheduling.check.cli import main

sys.exit(main())
