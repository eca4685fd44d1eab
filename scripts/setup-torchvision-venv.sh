#!/usr/bin/env bash
# Create (or reuse) .venv-torchvision: torchvision's real models for tests/tensor/test_resnet18.py.
# Why a second venv: PyPI's torchvision wheels are built against PyPI's (CUDA) torch, and the one
# for torch 2.13 does not import beside the project's CPU build of torch 2.13 ("operator
# torchvision::nms does not exist": its _C.so links libtorch_cuda). torch 2.14.1 with
# torchvision 0.29.1 from PyPI import and run on a CPU, so this venv has those (~5.5 GB, CUDA
# libraries included) and actormesh, editable; .venv keeps torch 2.13.0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
say() { echo "setup-torchvision-venv: $*"; }
if [ -x .venv-torchvision/bin/python ] && .venv-torchvision/bin/python -c "import torchvision, actormesh" 2>/dev/null; then
  say "reusing .venv-torchvision"
  exit 0
fi
[ -x .venv-torchvision/bin/python ] || "$PY" -m venv .venv-torchvision
quiet_pip() { .venv-torchvision/bin/python -m pip install -q "$@" 2>&1 | grep -v "is ignored" || true; }
start=$SECONDS
say "installing torch 2.14.1 and torchvision 0.29.1 (PyPI's builds, ~5.5 GB) ..."
quiet_pip "torch==2.14.1" "torchvision==0.29.1" "numpy>=1.26"
say "installing actormesh (editable) and pytest ..."
quiet_pip -e . "pytest>=8"
.venv-torchvision/bin/python -c "import torchvision, actormesh" || { echo "torchvision did not install" >&2; exit 1; }
say "done in $((SECONDS - start)) s: torch $(.venv-torchvision/bin/python -c 'import torch; print(torch.__version__)'), torchvision $(.venv-torchvision/bin/python -c 'import torchvision; print(torchvision.__version__)')"
