#!/usr/bin/env bash
# Creates or refreshes .venv-helm: Python 3.12 with PyPI's helm-sdkpy, which bundles the real Helm v4 Go library
# (lint, package, show). The tests (in .venv, Python 3.11) call it through tools/helm_render/real_helm.py.
# helm-sdkpy needs Python >= 3.12: taken from $HELM_PYTHON, else python3.12 on PATH, else the image's pyenv.
# Idempotent: a stamp of the inputs' hash makes a second run instant.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_SDKPY=helm-sdkpy==0.1.32  # Helm v4.3.0 inside
VENV=.venv-helm
STAMP=$VENV/.attrib-setup-stamp

is_312() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1; }
PY=""
# The first that runs as 3.12 (pyenv's python3.12 shim exists but fails where 3.12 is not a selected version).
for cand in "${HELM_PYTHON:-}" "$(command -v python3.12 || true)" \
            $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python 2>/dev/null | sort -rV); do
  if is_312 "$cand"; then PY=$cand; break; fi
done
if [ -z "$PY" ]; then
  echo "setup-helm-venv: no Python 3.12 found (tried \$HELM_PYTHON, python3.12 on PATH, ~/.pyenv/versions/3.12.*)." >&2
  echo "  helm-sdkpy (real Helm for the chart tests) needs Python 3.12: install one, or set HELM_PYTHON." >&2
  exit 1
fi

want=$( (cat scripts/setup-helm-venv.sh; "$PY" --version) | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  exit 0
fi

echo "setting up $VENV with $HELM_SDKPY ($PY)" >&2
rm -rf "$VENV"
"$PY" -m venv "$VENV"
LOG=$VENV/setup.log
if ! "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$HELM_SDKPY" >"$LOG" 2>&1; then
  echo "setup-helm-venv: pip install $HELM_SDKPY failed; last lines of $LOG:" >&2; tail -n 30 "$LOG" >&2; exit 1
fi
"$VENV/bin/python" -c "import helm_sdkpy; helm_sdkpy.get_version()" >/dev/null 2>&1 || {
  echo "setup-helm-venv: $VENV cannot load helm_sdkpy's Helm library" >&2; exit 1; }
echo "$want" > "$STAMP"
