"""gpu-scheduler: pin replica N of a StatefulSet to a named node and named GPUs.

Programs: :mod:`.scheduler`, :mod:`.webhook`, :mod:`.check`, :mod:`.mapcli`, :mod:`.certs`
(generate-webhook-certs.py's); the library they share: :mod:`.domain`, :mod:`.kube`,
:mod:`.base` (docs/architecture.md).
"""
