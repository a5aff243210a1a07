"""``gpu-scheduler-webhook``: the admission webhook program (:mod:`.serve`); docs/webhook.md."""
