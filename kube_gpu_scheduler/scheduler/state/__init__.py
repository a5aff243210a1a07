"""What the scheduler knows of the cluster (who holds which GPU, what each node's pods take, its own pods) and its writes to a pod (bind, condition, recreate)."""
