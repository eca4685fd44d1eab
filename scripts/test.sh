#!/usr/bin/env bash
# Install actormesh with its test and lint tools into .venv, check style and types, run the tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-venv.sh dev
. .venv/bin/activate
ruff check .
ruff format --check .
mypy
python -m pytest "$@"
