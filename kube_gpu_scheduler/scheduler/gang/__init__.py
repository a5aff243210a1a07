"""Gang placement in the standalone loop: every replica of a map revision, or none (DRA mode's gate: :mod:`kube_gpu_scheduler.scheduler.dra.gang`)."""
