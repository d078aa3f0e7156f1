# Two commands do all the set-up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev,calibrate]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/llmsim evaluate scenarios/quickstart.yaml

test: $(STAMP)
	$(BIN)/python -m pytest -q -n auto

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_evaluate.py
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_sweep.py
	$(BIN)/python benchmarks/bench_moe.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
