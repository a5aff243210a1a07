"""``gpu-scheduler``: the scheduler program (:mod:`.main`); docs/scheduler.md."""
