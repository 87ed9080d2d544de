# The two commands of the quickstart: `make run` and `make test`. Each creates .venv when missing and
# (re)installs the package only when pyproject.toml or constraints.txt changed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-slow browser lint format bench images clean

$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "asyncrl needs Python >= 3.11"'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/asyncrl run configs/local.yaml

# The default suite on two pytest-xdist workers (this machine's two cores; compile-bound tests
# overlap well); the tests that read a shared whole-pipeline run go to one worker (tests/conftest.py).
TEST_WORKERS ?= 2
test: setup lint browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# Debian's chromium for the report's browser test, where it can be installed (root with apt);
# elsewhere that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed: tests/test_report_browser.py will be skipped"

# The long tests (whole-pipeline variants, multi-process runs); .ci/run runs them after `make test`.
test-slow: setup
	$(BIN)/python -m pytest -q -m slow

# The runtime image, from digest-pinned base images only (images/base-images.txt).
IMAGE ?= asyncrl-runtime:dev
images:
	python3 images/pins.py check
	docker build $$(python3 images/pins.py build-args) -f images/runtime.Dockerfile -t $(IMAGE) .

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
