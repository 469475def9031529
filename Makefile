# Two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON ?= $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON ?= $(abspath $(PY))

.PHONY: venv demo test lint typecheck review soak bench clean config-reference sysdeps-test sysdeps-bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[spark,test]'
	-git config core.hooksPath .githooks && git config commit.template .gitmessage
	touch $(STAMP)

# `make demo ICEBERG=1`: the same ingestion published as an Apache Iceberg table.
demo: $(STAMP)
	$(PY) -m shuffled.demo $(if $(ICEBERG),--iceberg)

lint: $(STAMP)
	$(VENV)/bin/lint-imports

# mypy as configured in pyproject.toml ([tool.mypy]): strict on the daemon side and the
# client, clean on the rest of shuffled/.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# Prompts for review (modules over ~600 lines, folders over ~15 modules); never fails.
review: $(STAMP)
	$(PY) scripts/review_sizes.py

# Real tools from Debian's packages, installed when missing (see scripts/sysdeps.sh).
sysdeps-test:
	scripts/sysdeps.sh promtool=prometheus prometheus=prometheus chromium=chromium \
		pg_ctlcluster=postgresql

sysdeps-bench:
	scripts/sysdeps.sh nginx=nginx wrk=wrk

# Two workers, a module to a worker; then in one process the tests marked serial: those that
# read the disk's free space (another worker's writes move it) and schemathesis' (its items
# share one node id, and xdist ran one of them).
test: $(STAMP) lint typecheck review sysdeps-test
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow and not serial" --durations=15
	$(PY) -m pytest -q -m "serial and not slow"

soak: $(STAMP)
	$(PY) -m pytest -q -m slow -s

# The daemons and Spark workers under test start as a wheel install would: pip compiles a
# wheel's modules at install, an editable install does not, and where the environment sets
# PYTHONDONTWRITEBYTECODE every start compiles shuffled's ~100 modules again (130 ms of a
# 0.6 s daemon start here).
bench: $(STAMP) sysdeps-bench
	$(PY) -m compileall -q shuffled
	$(PY) -m bench

config-reference: $(STAMP)
	$(PY) -m shuffled config-reference > docs/configuration.md

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
