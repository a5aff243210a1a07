"""The domain: the map's grammar, the placement rules, injection and DRA's shapes.

Pure logic: no I/O, no Kubernetes client (the ``pure-domain`` import contract in pyproject.toml).
"""
