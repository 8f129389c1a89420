#!/usr/bin/env bash
# Install what a fresh Debian machine lacks to build spotctl's virtual environment.
# Idempotent: does nothing when python3 with venv/ensurepip is already there.
set -euo pipefail
py=${PYTHON:-python3}
need=()
command -v "$py" >/dev/null 2>&1 || need+=(python3)
if command -v "$py" >/dev/null 2>&1 && ! "$py" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "bootstrap: missing ${need[*]}; run as root or: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  echo "bootstrap: installing ${need[*]} (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || {
  echo "bootstrap: spotctl needs Python >= 3.11 ($py is $("$py" -V 2>&1))" >&2; exit 1; }
