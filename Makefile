# Two commands from a fresh clone: `make demo` and `make test`. Each sets up everything itself.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test test-long test-fast lint typecheck imports check install system-deps bench clean trainer-image mutation

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "error: $(PY) not found: install Python 3.11+"; exit 1; }
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# torch first, pinned to the CPU wheel: the range in pyproject.toml admits it, so the
	@# project install that follows adds nothing (and never pulls a multi-GB CUDA build).
	$(BIN)/python -m pip install -q 'torch==2.13.0'
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

system-deps:
	@bash scripts/ensure-system-deps.sh

demo: $(STAMP) system-deps
	$(BIN)/python demo/run.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

imports: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck imports

# Two pytest workers, one per core: most slow tests wait on real workers, trainers and
# sshd rather than compute, so two at once halve the wall time. Each worker starts its own
# redis-server, databases and sshd (free ports, temp dirs); a test file stays on one worker.
TEST_WORKERS ?= 2

# The policy layer decides money: every line and branch of app/policy runs under the suite, or
# the run fails (a line that cannot run says why in its `# pragma: no cover` comment).
COVERAGE := --cov=app/policy --cov-branch --cov-report=term-missing:skip-covered --cov-fail-under=100

# The campaign drivers' real-time comparison (marked `solo`) bills its simulated hosts by the wall
# clock: another test's trainers on the same two cores stretch those hosts' lives past the virtual
# driver's, so it runs first, alone. The suite is CPU-bound on two cores, so end-to-end runs of
# over a minute whose capability a test here also exercises are the `long` tier (`make test-long`,
# about ten minutes): a second host loss, standby and hedged recoveries, cancel and resume, TRL
# through the fleet, two homes, a research restart, twenty kills, the triage fast path's sweeps.
test: $(STAMP) system-deps check
	$(BIN)/python -m pytest -q -m solo
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not solo and not long" --durations=10 $(COVERAGE)

test-long: $(STAMP) system-deps
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m long --durations=10

# The image a job names in needs.image to skip the host's bootstrap (docs/trainer.md); push it yourself.
# `make test` builds it too (tests/integration/trainer/test_trainer_image.py) where a Docker daemon answers.
TRAINER_IMAGE ?= tuneharness-trainer:latest
trainer-image:
	docker build -f trainer/Dockerfile -t $(TRAINER_IMAGE) .

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

# Mutation testing of the policy that decides money (the modules in pyproject.toml's [tool.mutmut]):
# a fresh mutmut run against tests/unit/policy, then the kill rate per module and every surviving
# mutant in bench/results/mutation.json. Fails below a 90% kill rate or on a survivor that no test
# kills and bench/mutation.py does not explain as equivalent. A few minutes on two workers.
MUTATION_WORKERS ?= 2
mutation: $(STAMP)
	$(BIN)/python bench/mutation.py --max-children $(MUTATION_WORKERS)

# The CPU benchmarks one after another, each writing bench/results/<name>.json, then
# docs/benchmarks.md from every results file. bench/gpu.py needs a CUDA machine: run it there,
# bring bench/results/gpu.json back, then `python bench/report.py` (docs/benchmarks.md says how).
# BENCH_PG: the PostgreSQL database the ledger and budget are also timed on (empty: SQLite only).
BENCH_PG ?= postgresql+psycopg://postgres@127.0.0.1:5432/th_bench
bench: $(STAMP) system-deps
	$(BIN)/python bench/foundation.py $(if $(BENCH_PG),--pg $(BENCH_PG))
	$(BIN)/python bench/campaign.py --only shipped
	$(BIN)/python bench/campaign_drivers.py
	$(BIN)/python bench/trainer.py --hidden 128 --steps 2000 --checkpoint-every 100 --slice-seconds 20 --sps-steps 100 --repeats 3
	taskset -c 0 $(BIN)/python bench/triage.py
	$(BIN)/python bench/triage.py --chain
	$(BIN)/python bench/triage_real.py
	$(BIN)/python bench/report.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
