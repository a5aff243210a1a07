"""The infrastructure layer: how the components talk to the apiserver and serve TLS.

Nothing here imports the programs, the domain or the dev tooling (the ``layers``
import contract in pyproject.toml): the programs build on it, never the other way round. Modules: :mod:`.client`
(the client loader), :mod:`.errors` (the apiserver's Status), :mod:`.jsonio`
(JSON lists, reads and writes), :mod:`.informer` (list-then-watch caches),
:mod:`.backoff`, :mod:`.timefmt` (API time formats), :mod:`.tls` (server contexts).
"""
