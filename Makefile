# Every target sets up .venv first (idempotent), so a fresh clone needs nothing else.
.PHONY: setup system helm demo test unit lint picture compiled unit-compiled

setup:
	@bash scripts/setup-venv.sh

# Debian packages the tests drive (prometheus, promtool, chromium, go + sprig; kubectl where apt has it)
system:
	@bash scripts/setup-system.sh

# .venv-helm: Python 3.12 with helm-sdkpy (real Helm v4) for the chart's lint and package tests
helm:
	@bash scripts/setup-helm-venv.sh

demo: setup
	.venv/bin/attrib-agent demo

# The last lines give the skip count (tests/conftest.py); with CI=true an unexpected skip fails the run.
test: setup system helm
	.venv/bin/python -m pytest

unit: setup
	.venv/bin/python -m pytest -m "not e2e"

lint: setup
	.venv/bin/ruff check attrib_agent plugins tests
	.venv/bin/mypy

# Redraw docs/img/page.png (the README's picture) from the page test's replayed state in headless Chromium
picture: setup system
	ATTRIB_UPDATE_PICTURE=1 .venv/bin/python -m pytest tests/unit/sinks/test_page_browser.py -k screenshot -q

# Optional: the agent's wheel with the re-simulation's core built by mypyc (setup.py; docs/deployment.md), in dist/
compiled: setup
	ATTRIB_MYPYC=1 .venv/bin/python -m pip wheel --no-build-isolation --no-deps --no-index -w dist .

# The unit tests against that build: the wheel installed under ~/.cache/attrib-agent/bench (built once per source
# hash, as `replay_throughput --compiled`), first on the path (-P: not this checkout's package), this checkout's
# tests and benchmarks after it; ATTRIB_EXPECT_BUILD makes test_compiled_build check the suite ran compiled
unit-compiled: setup
	site=$$(.venv/bin/python -c "from benchmarks.replay_throughput import compiled_site; print(compiled_site(None))") \
	  && ATTRIB_EXPECT_BUILD=compiled PYTHONPATH=$$site:$(CURDIR) .venv/bin/python -P -m pytest -p no:cacheprovider \
	     -o pythonpath=tools/helm_render tests/unit
