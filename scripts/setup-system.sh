#!/usr/bin/env bash
# System tools the tests drive for real (Debian packages): Prometheus + promtool for the dashboards' queries
# and alert rules, Chromium for the page's render test, Go with Sprig for rendering the Helm chart the way
# helm does, and kubectl where an apt source has it (kustomize). Idempotent: installs only what is missing.
set -euo pipefail
PKGS=(prometheus chromium golang-go golang-github-masterminds-sprig-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# kubectl (its built-in kustomize merges the chart's pod patch in test_helm_pod_patch.py): Debian has no
# kubectl package; this machine image ships one from the Kubernetes apt repository, so take it from apt
# where a configured source offers it. Without it that test skips, which fails a CI=true run.
if ! command -v kubectl >/dev/null 2>&1; then
  if [ -n "$(apt-cache policy kubectl 2>/dev/null | sed -n 's/^ *Candidate: //p' | grep -v '(none)')" ]; then
    missing+=(kubectl)
  else
    echo "setup: kubectl is not installed and no apt source offers it: the kustomize test will skip" >&2
  fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "setup: installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null 2>&1 || true
if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/attrib-apt.log 2>&1; then
  echo "setup: apt-get install failed; last lines:" >&2; tail -n 20 /tmp/attrib-apt.log >&2; exit 1
fi
# Debian's prometheus package starts a service where systemd runs; the tests start their own on loopback.
