"""``python -m kube_gpu_scheduler.check``: the same as the ``gpu-scheduler-check`` console script."""

import sys

from kube_gpu_scheduler.check.cli import main

sys.exit(main())
