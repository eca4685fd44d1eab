#!/usr/bin/env bash
# Install actormesh with its test and lint tools into .venv (this builds the JupyterLab sidebar
# from labextension/, which needs node and the npm registry), check style and types, run the
# sidebar's TypeScript tests, then the Python tests (tests/ui drives Debian's chromium).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { echo "::step [$((SECONDS))s] $*"; }
# Said before anything is installed: what this changes outside the checkout.
if [ "$(id -u)" = 0 ]; then
  echo "test.sh runs as root, so besides .venv it changes this machine: it apt-installs"
  echo "  node and Debian's chromium when missing (the sidebar's build and browser tests),"
  echo "  Slurm and munge (tests/multihost/test_slurm.py; no daemon stays running),"
  echo "and tests/multihost creates network namespaces, a bridge and veth links (fake hosts,"
  echo "scripts/fakehosts/), removed when they end. As another user none of that happens:"
  echo "missing node or chromium is installed with sudo if needed, and those tests skip."
else
  echo "test.sh: installs into .venv; node and chromium (when missing) via sudo apt-get;"
  echo "  the multi-host and Slurm tests need root and skip."
fi
step "node and chromium"
bash scripts/install-browser.sh
export YARN_ENABLE_IMMUTABLE_INSTALLS=true  # labextension/yarn.lock is the truth
step "venv"
bash scripts/setup-venv.sh dev
. .venv/bin/activate
if [ ! -f actormesh/labextension/package.json ]; then
  echo "the sidebar was not built (actormesh/labextension/ is missing); see pip's output above" >&2
  exit 1
fi
step "torchvision venv"
# tests/tensor/test_resnet18.py runs torchvision's resnet18 in a venv of its own (the script says
# why); with ACTORMESH_TORCHVISION_TESTS=1 a missing venv fails that test instead of skipping it.
bash scripts/setup-torchvision-venv.sh
export ACTORMESH_TORCHVISION_TESTS=1
step "slurm"
# The Slurm integration test (tests/multihost/test_slurm.py) needs Slurm from Debian's packages;
# without root or apt it skips and says why.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  bash scripts/slurm/install.sh || echo "could not install Slurm: its integration test will skip"
fi
step "lint and types"
ruff check .
ruff format --check .
mypy
step "labextension tests"
(cd labextension && jlpm install >/dev/null && jlpm test) || {
  echo "labextension tests failed: cd labextension && jlpm test" >&2
  exit 1
}
step "pytest"
export ACTORMESH_UI_TESTS=1  # a missing browser fails the UI tests instead of skipping them
# Two workers (pytest-xdist): the tests mostly wait on processes, kernels and a browser, so a
# serial run keeps less than one core busy. ACTORMESH_TEST_WORKERS=0 runs them in this process.
python -m pytest -n "${ACTORMESH_TEST_WORKERS:-2}" --dist loadgroup "$@"
step "done: to open the notebooks, .venv/bin/jupyter lab notebooks/"
