#!/usr/bin/env bash
# Create (or reuse) .venv with torch's CPU build first, then actormesh and the given extras.
# Usage: setup-venv.sh [EXTRAS]. Says what it installs as it goes (pip itself is kept quiet:
# its errors still show); 2.5-3.5 minutes on a fresh 2-core machine.
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
# The CPU build comes from PyTorch's CPU index (PyPI's torch is the CUDA build), unless pip is
# configured with a local wheel directory that has it (this project's machines: no download).
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
say "installing torch 2.13.0 (CPU build, ~200 MB) and numpy into .venv ..."
if .venv/bin/python -m pip install -q --no-index --no-deps "torch==2.13.0" >/dev/null 2>&1; then
  quiet_pip "torch==2.13.0" "numpy>=1.26"  # its dependencies (torch itself is there)
else
  say "(torch from $TORCH_INDEX)"
  quiet_pip --index-url "$TORCH_INDEX" "torch==2.13.0"
  quiet_pip "numpy>=1.26"
fi
.venv/bin/python -c "import torch" || { echo "torch did not install" >&2; exit 1; }
target=.
[ -n "$extras" ] && target=".[$extras]"
say "installing actormesh ($target, editable) and its dependencies (Jupyter kernel, debugger${extras:+, $extras extras}) ..."
quiet_pip -e "$target"
.venv/bin/python -c "import actormesh" || { echo "actormesh did not install" >&2; exit 1; }
say "done: .venv has actormesh $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("actormesh"))') and torch $(.venv/bin/python -c 'import torch; print(torch.__version__)')"
