# One-command setup and runs. Everything installs into ./.venv from this repository's own files.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export NUMBA_CACHE_DIR := $(CURDIR)/.cache/numba
export MPLBACKEND := Agg

.PHONY: install demo test test-full lint validate clean-outputs

SERVER_CONFIG := jupyter-config/jupyter_server_config.d/cglib.json

$(STAMP): pyproject.toml $(SERVER_CONFIG)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# an editable install skips pyproject's data-files: enable cglib.widget_state for `jupyter lab` here too
	mkdir -p $(VENV)/etc/jupyter/jupyter_server_config.d
	cp $(SERVER_CONFIG) $(VENV)/etc/jupyter/jupyter_server_config.d/cglib.json
	$(PY) -m ipykernel install --sys-prefix --name cglib --display-name "Python (cglib)"
	$(PY) -c "from cglib.frontend import ensure_lab_settings; print('wrote', ensure_lab_settings())"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/cglib run params/demo.yaml

# one pytest-xdist worker per core, at most four; a worker runs a whole group of test files (book/tests.md)
PYTEST_WORKERS := -n logical --maxprocesses 4 --dist loadscope --no-loadscope-reorder

test: install
	$(PY) -m pytest -m "not full" $(PYTEST_WORKERS)

test-full: install
	$(PY) -m pytest $(PYTEST_WORKERS)

lint: install
	$(VENV)/bin/ruff check cglib tests benchmarks

validate: install
	$(VENV)/bin/cglib validate params/demo.yaml
	$(VENV)/bin/cglib validate params/demo_as_published.yaml
	$(VENV)/bin/cglib validate params/hierarcaps.yaml --no-check-paths
	$(VENV)/bin/cglib validate params/paper.yaml --no-check-paths
	$(VENV)/bin/cglib validate params/paper_corrected.yaml --no-check-paths

clean-outputs:
	find outputs -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
