#!/usr/bin/env bash
# Install actormesh into .venv and run the quickstart on a local CPU mesh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-venv.sh
exec .venv/bin/python examples/quickstart.py
