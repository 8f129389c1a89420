#!/usr/bin/env bash
# Install, in one apt transaction, what a fresh Debian machine lacks to build spotctl's virtual
# environment and run its test services: python3 (>= 3.11), its venv/ensurepip module, and procps
# (ps/pgrep, used by scripts/testenv/*). Idempotent: does nothing when all of them are there.
set -euo pipefail
py=${PYTHON:-python3}
need=()
if ! command -v "$py" >/dev/null 2>&1; then
  # the run that installs python3 must install its venv module too (Debian splits it out)
  need+=(python3 python3-venv)
elif ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
{ command -v ps && command -v pgrep; } >/dev/null 2>&1 || need+=(procps)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "bootstrap: missing ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing ${need[*]} (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt=(apt-get -o DPkg::Lock::Timeout=300 -o Acquire::Retries=3)
  "${apt[@]}" update -qq
  "${apt[@]}" install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
command -v "$py" >/dev/null 2>&1 || { echo "bootstrap: $py is still missing after apt" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "bootstrap: spotctl needs Python >= 3.11 ($py is $("$py" -V 2>&1))" >&2; exit 1; }
"$py" -c 'import venv, ensurepip' >/dev/null 2>&1 || {
  echo "bootstrap: $py has no working venv/ensurepip module (install python3-venv)" >&2; exit 1; }
