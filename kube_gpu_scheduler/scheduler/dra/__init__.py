"""DRA mode: the claim controller (:mod:`.controller`) that turns each replica's map entry into its ResourceClaims, with its indexes, handlers, writes, taints, waits, gangs and metrics."""
