# Every target sets up .venv first (idempotent), so a fresh clone needs nothing else.
.PHONY: setup system demo test unit lint

setup:
	@bash scripts/setup-venv.sh

# Debian packages the tests drive (prometheus, promtool, chromium, go + sprig)
system:
	@bash scripts/setup-system.sh

demo: setup
	.venv/bin/attrib-agent demo

test: setup system
	.venv/bin/python -m pytest

unit: setup
	.venv/bin/python -m pytest -m "not e2e"

lint: setup
	.venv/bin/ruff check attrib_agent plugins tests
	.venv/bin/mypy
