#!/usr/bin/env bash
# Install actormesh into .venv, run the quickstart on a local CPU mesh, then run every notebook
# in notebooks/ in the actormesh kernel (to open them: `pip install jupyterlab`, then `jupyter lab notebooks`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-venv.sh notebook
.venv/bin/python examples/quickstart.py
exec .venv/bin/python scripts/run_notebooks.py
