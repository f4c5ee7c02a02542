# The two commands of the README: `make demo` and `make test`. Both set up .venv first, once.
PY     := .venv/bin/python
STAMP  := .venv/.autopar-installed
TORCH  := torch==2.13.0

.PHONY: setup demo test bench bench-update clean

$(PY):
	python3 -m venv .venv

# torch is installed first and pinned: an unpinned torch pulls a multi-GB CUDA build.
$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]' $(TORCH)
	touch $(STAMP)

setup: $(STAMP)

# the main job: a GPT planned by autopar and trained on 2 local CPU processes (gloo), with the
# plan's report and every step's loss beside the single-process run
demo: setup
	OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node 2 examples/train_gpt.py

# two pytest workers (the CI box has 2 cores), one test module per worker at a time: a module's
# fixtures (a gloo launch that serves all of its tests) run once
test: setup
	$(PY) -m pytest -q -n 2 --dist loadscope

bench: setup
	$(PY) -m benchmarks.run

# Changing the baseline is explicit and says why: make bench-update REASON="what changed and why"
bench-update: setup
	@test -n "$(REASON)" || { echo 'make bench-update needs REASON="why the baseline may move"'; exit 2; }
	$(PY) -m benchmarks.run --update --reason "$(REASON)"

clean:
	rm -rf .venv build *.egg-info .pytest_cache

# Whole-plan time and peak memory per case, each in a fresh process: writes benchmarks/plan_speed.md
.PHONY: bench-speed
bench-speed: setup
	$(PY) -m benchmarks.plan_speed

# The exact DP against the ILP on PaSE's four graphs (ILP limits raised for this run): dp_vs_ilp.md
.PHONY: bench-exact
bench-exact: setup
	$(PY) -m benchmarks.dp_vs_ilp

# Many models at once: fused vs one by one vs vmap on the local CPU beside autopar's choice, and
# Sharded-LRTF vs the joint CP-SAT schedule on a simulated 8xV100: writes benchmarks/many_models.md
.PHONY: bench-many
bench-many: setup
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.many_models

# The four largest published trainings planned on their clusters, and a device-count sweep 8..4096:
# writes benchmarks/scale.md
.PHONY: bench-scale
bench-scale: setup
	$(PY) -m benchmarks.scale
	$(PY) -m benchmarks.scale_moe

# The checks that need one H100/H200 (Llama 3 8B on 64 and 70B on 1,024 measured, op timings and
# fused-vs-one-by-one on the GPU): writes benchmarks/gpu_check.md; without a GPU, one line, exit 2
.PHONY: bench-gpu
bench-gpu: setup
	$(PY) -m benchmarks.gpu_check

# autopar's module beside DDP, parallelize_module and fully_shard on 2 and 4 gloo processes:
# writes benchmarks/runtime.md; run it on a quiet machine
.PHONY: bench-runtime
bench-runtime: setup
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.runtime
