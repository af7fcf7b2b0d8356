# The two Quick start commands: `make run` and `make test`. Each sets up everything it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8501
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(wildcard /opt/wheels))
UV = $(PY) -m uv pip install --quiet --python $(PY) --compile-bytecode $(foreach f,$(FIND_LINKS),--find-links $(f))

.PHONY: run dev test test-fast image-test setup assets bench clean wheel

$(VENV)/.installed: pyproject.toml setup.py requirements.txt requirements-dev.txt requirements-nodeps.txt
	$(PYTHON) -m venv $(VENV)
	# uv installs what pip would (the same versions: requirements*.txt pin them), resolving, downloading and
	# unpacking in parallel: a fresh setup took 79 s against pip's 184 s on 2 cores (29 Nov). uv reads no pip.conf,
	# so a folder of local wheels pip is told of (PIP_FIND_LINKS; this workplace's /opt/wheels holds torch's CPU
	# build) is passed on, and the bytecode compiled as pip does.
	$(PY) -m pip install --quiet uv==0.13.9
	# torch first and alone, so the pinned CPU wheel is taken before anything can pull a CUDA build.
	$(UV) --upgrade pip torch==2.13.0
	# The package itself, editable, with the app and the test tools; requirements*.txt pin the versions.
	$(UV) -r requirements-dev.txt -e ".[app,dev]"
	# Packages whose declared dependencies we must not install (requirements-nodeps.txt says why).
	$(UV) --no-deps -r requirements-nodeps.txt
	touch $@

setup: assets $(VENV)/.installed

# bertviz's JavaScript comes from npm. Without npm the app still runs (the bertviz page says how to add them).
assets:
	@if command -v npm >/dev/null 2>&1; then scripts/install_assets.sh; \
	elif ! scripts/install_assets.sh >/dev/null 2>&1; then \
		echo "NOTE: npm not found: the app runs, but the bertviz page needs its JavaScript (apt-get install nodejs npm, then make setup)."; fi

# No file watcher, as in the image: its polling of every imported file in the checkout (.venv included) held a core,
# and a reply was generated at 2 tokens/s instead of 17. `make dev` keeps it, to reload on save.
run: setup
	$(VENV)/bin/streamlit run app.py --server.port $(PORT) --server.fileWatcherType none

dev: setup
	$(VENV)/bin/streamlit run app.py --server.port $(PORT)

# A wheel of the package (the core, the notebook API and bertviz's JavaScript) in dist/.
wheel: assets
	$(PY) -m pip wheel --no-deps --wheel-dir dist .

# Two phases (scripts/run_tests.py): the tests over the cores with pytest-xdist, then the `serial` ones alone; the 25
# slowest are listed at the end. AE_TEST_WORKERS=1 runs the first phase in one process.
test: setup
	@command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || \
		echo "NOTE: Chromium is not installed, so the browser tests will be SKIPPED (apt-get install chromium)."
	$(PY) scripts/run_tests.py -ra $(PYTEST_ARGS)

# Build the Dockerfile with buildah and check the running image (root; apt-get install buildah debootstrap).
# It builds once, the image that ships; IMAGE_TEST_ARGS=--with-preload adds a second build with PRELOAD_MODEL.
image-test: setup
	$(PY) scripts/image_test.py $(IMAGE_TEST_ARGS)

# The inner loop: everything but the slow and browser tests.
test-fast: setup
	$(PY) scripts/run_tests.py -ra -m "not slow and not browser" $(PYTEST_ARGS)

bench: setup
	$(PY) bench/bench_model_core.py

clean:
	rm -rf $(VENV) node_modules static/vendor attention_explorer/views/vendor build dist *.egg-info .pytest_cache
