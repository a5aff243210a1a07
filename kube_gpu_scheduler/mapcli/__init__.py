"""``gpu-scheduler-map``: check and explain maps before they reach a cluster (:mod:`.cli`)."""
