#!/usr/bin/env bash
# Create (or reuse) .venv with torch's CPU build first, then actormesh and the given extras.
# Usage: source-free; prints nothing on success except pip's errors.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras=${1:-}
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# torch first: a bare `torch` requirement resolved later would pull several GB of CUDA packages
# (numpy with it, so that importing torch below does not warn that numpy is missing).
.venv/bin/python -m pip install -q "torch==2.13.0" "numpy>=1.26" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch" || { echo "torch did not install" >&2; exit 1; }
if [ -n "$extras" ]; then
  .venv/bin/python -m pip install -q -e ".[$extras]" 2>&1 | grep -v "is ignored" || true
else
  .venv/bin/python -m pip install -q -e . 2>&1 | grep -v "is ignored" || true
fi
.venv/bin/python -c "import actormesh" || { echo "actormesh did not install" >&2; exit 1; }
