"""Tenancy in the scheduler: what each GPUPinningPolicy's namespaces hold and may take (:mod:`.holdings`), and what the scheduler writes about the policies (:mod:`.status`)."""
