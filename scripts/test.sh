#!/usr/bin/env bash
# Install actormesh with its test and lint tools into .venv, check style and types, run the tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-venv.sh dev
. .venv/bin/activate
# The Slurm integration test (tests/multihost/test_slurm.py) needs Slurm from Debian's packages;
# without root or apt it skips and says why.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  bash scripts/slurm/install.sh || echo "could not install Slurm: its integration test will skip"
fi
ruff check .
ruff format --check .
mypy
python -m pytest "$@"
