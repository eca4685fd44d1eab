#!/usr/bin/env bash
# Create (or reuse) .venv with torch's CPU build first, then actormesh and the given extras.
# Usage: setup-venv.sh [EXTRAS]. Says what it installs as it goes (pip itself is kept quiet:
# its errors still show); about a minute on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras=${1:-}
PY=${PYTHON:-python3}
say() { echo "setup-venv: $*"; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
quiet_pip() { .venv/bin/python -m pip install -q "$@" 2>&1 | grep -v "is ignored" || true; }
quiet_pip --upgrade pip
# torch first: a bare `torch` requirement resolved later would pull several GB of CUDA packages
# (numpy with it, so that importing torch below does not warn that numpy is missing).
say "installing torch 2.13.0 (CPU build, ~200 MB) and numpy into .venv ..."
quiet_pip "torch==2.13.0" "numpy>=1.26"
.venv/bin/python -c "import torch" || { echo "torch did not install" >&2; exit 1; }
target=.
[ -n "$extras" ] && target=".[$extras]"
say "installing actormesh ($target, editable) and its dependencies (Jupyter kernel, debugger${extras:+, $extras extras}) ..."
quiet_pip -e "$target"
.venv/bin/python -c "import actormesh" || { echo "actormesh did not install" >&2; exit 1; }
say "done: .venv has actormesh $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("actormesh"))') and torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
