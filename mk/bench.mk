# make bench: the gpu-scheduler and its webhook against baselines on the local control plane
# (bench/, docs/testing.md "The benchmark harness"). Writes docs/benchmarks.md and docs/benchmarks.png;
# BENCH_SCALE=huge (5,000 nodes, by hand only) writes docs/benchmarks-huge.md, BENCH_SCALE=dra
# (the DRA phase alone at 1,000 nodes, by hand only) docs/benchmarks-dra.md.
BENCH_SCALE ?= default

.PHONY: bench

bench: venv tools ## Measure scheduler/webhook vs kube-scheduler and raw Bindings (BENCH_SCALE=default|full|smoke|huge|dra)
	BENCH_SCALE=$(BENCH_SCALE) BENCH_COMMAND="make bench BENCH_SCALE=$(BENCH_SCALE)" $(PY) -m bench
