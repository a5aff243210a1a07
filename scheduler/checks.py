"""The scheduler's placement checks live in :mod:`gpu_scheduling.rules` (one module for every front end).

This name stays so that ``scheduler.checks.X`` still means ``gpu_scheduling.rules.X``.
"""

from __future__ import annotations

from gpu_scheduling.rules import *  # noqa: F403
