# One place for every set-up and check step; .ci/run calls `make test` only.
PYTHON_SYSTEM ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed

.PHONY: demo test check lint typecheck docs pythons unit bench bench-scale bench-futures bench-remote bench-ends bench-report system-deps schedulers stop-schedulers clean \
	compat-dist

$(STAMP): pyproject.toml
	$(PYTHON_SYSTEM) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	$(PY) -m compileall -q src >/dev/null
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# OpenMPI (and the real schedulers' packages) when root and apt are there; a note otherwise.
system-deps:
	@bash tests/setup/system-deps.sh

# The scheduler tests need a real Slurm and Grid Engine, and the ssh tests an sshd on 127.0.0.1
# (tests/setup/start-sshd.sh): started before the tests, stopped after them even when they fail
# (only the daemons the start scripts started are stopped). A test run
# holds a shared lock while its tests run; the schedulers are stopped only when no other run on
# this machine holds it.
SCHEDULERS_LOCK ?= /tmp/psij-test-schedulers.lock

test: $(STAMP) system-deps check docs pythons schedulers
	flock -s $(SCHEDULERS_LOCK) $(MAKE) unit; rc=$$?; $(MAKE) stop-schedulers; exit $$rc

schedulers:
	@bash tests/setup/start-slurm.sh && bash tests/setup/start-sge.sh \
		&& bash tests/setup/start-sshd.sh \
		|| { $(MAKE) stop-schedulers; exit 1; }

stop-schedulers:
	@flock -n -E 75 -x $(SCHEDULERS_LOCK) sh -c \
		'bash tests/setup/stop-sshd.sh; rc=$$?; bash tests/setup/stop-sge.sh || rc=1; \
		 bash tests/setup/stop-slurm.sh || rc=1; exit $$rc' \
		|| { rc=$$?; [ $$rc = 75 ] || exit $$rc; \
		     echo "schedulers left running: another test run is using them"; }

# The whole tests/ tree: unit tests named after their module at its top, integration/, real/
# (the schedulers and sshd of tests/setup) and benchmarks/, in two chains side by side (see
# tests/setup/run-tests.sh). A run that collects nothing fails (pytest's status 5), and so does
# one where a test module under tests/ gives no test (conftest).
unit: $(STAMP)
	PY=$(PY) bash tests/setup/run-tests.sh

check: lint typecheck

# The oldest and the newest supported Python (pyproject.toml: requires-python, classifiers), side
# by side, each in a throwaway virtual environment: `pip install .` from this checkout (not
# editable), a smoke check (every module imports, local jobs, the psij command) and a few unit
# test modules (tests/setup/pythons.sh). A Python not found fails it, saying where it looked;
# PYTHONS_MISSING=warn goes on without it (reported as NOT CHECKED).
PYTHONS_MISSING ?= fail

pythons:
	@PYTHONS_MISSING=$(PYTHONS_MISSING) bash tests/setup/pythons.sh

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict src/psij

docs: $(STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html

# The metadata-only psij-python wheel that lets clients requiring psij-python install next to
# psij (docs/compat.rst); written to dist/.
compat-dist: $(STAMP)
	$(PY) -m build --wheel --no-isolation --outdir dist compat/psij-python

bench: $(STAMP)
	rc=0; $(PY) bench/run.py || rc=$$?; $(PY) bench/batch.py || rc=$$?; \
		$(PY) bench/pilot_scheduler.py || rc=$$?; $(PY) bench/pilot.py || rc=$$?; \
		$(PY) bench/registry.py || rc=$$?; $(PY) bench/pilot_iterations.py || rc=$$?; \
		$(PY) bench/spawn_ceiling.py || rc=$$?; $(PY) bench/sbatch_floor.py || rc=$$?; \
		$(PY) bench/holding.py || rc=$$?; \
		$(PY) bench/supervise.py || rc=$$?; $(PY) bench/flow_machine.py || rc=$$?; \
		$(PY) bench/scale.py || rc=$$?; $(PY) bench/remote.py || rc=$$?; exit $$rc

# Every throughput figure of this machine in one run (local, pilot, the peers, the spawn
# ceiling), against the goals; BENCH_SCALE_ARGS passes options (e.g. --cores 16 --rounds 5).
bench-scale: $(STAMP)
	$(PY) bench/scale.py $(BENCH_SCALE_ARGS)

# psij.futures against submitit 1.5.2: calls/s of a trivial function on this machine (local,
# pilot) and through Slurm arrays; BENCH_FUTURES_ARGS passes options (e.g. --quick, --no-slurm).
bench-futures: $(STAMP)
	$(PY) bench/futures.py $(BENCH_FUTURES_ARGS)

# Executors over SSH against the same executors used on the remote host itself: connecting, the
# overhead per submit, submit_many, local and Slurm (a test sshd and a user made for the run; a
# note and exit 0 without them); BENCH_REMOTE_ARGS passes options (e.g. --quick, --no-slurm).
bench-remote: $(STAMP)
	$(PY) bench/remote.py $(BENCH_REMOTE_ARGS)

# Seconds from a batch job's own end to its wait() returning, 50 jobs of 1 s on the real Slurm
# and Grid Engine, one by one and with submit_many, ours and psij-python 0.9.11 in the same run,
# with the scheduler commands per minute of each (a scheduler not running is skipped, saying
# so); BENCH_ENDS_ARGS passes options (e.g. --jobs 10 --executor slurm --no-reference).
bench-ends: $(STAMP)
	$(PY) bench/batch_ends.py $(BENCH_ENDS_ARGS)

# psij report for 100,000 jobs (a pilot run and the registry): the time to make it, the size
# of its HTML page and Chromium's time to open it; BENCH_REPORT_ARGS passes options (e.g.
# --jobs 20000, --screenshot docs/report-screenshot.png to remake the documentation's picture).
bench-report: $(STAMP)
	$(PY) bench/report_size.py $(BENCH_REPORT_ARGS)

clean:
	rm -rf $(VENV) build dist docs/_build .bench-venvs .test-cache
