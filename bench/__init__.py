"""``make bench``: the gpu-scheduler and its webhook measured against baselines, in one run.

Developer tooling, run from the checkout (``python -m bench``); not part of the
distribution. See docs/benchmarks.md (written by the run) and the README's
"Tests and benchmarks".
"""
