#!/usr/bin/env bash
# Install actormesh (with JupyterLab: the notebook extra) into .venv, run the quickstart on a
# local CPU mesh, then run every notebook in notebooks/ in the actormesh kernel.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup-venv.sh notebook
echo "demo: examples/quickstart.py on a local 4-process CPU mesh"
.venv/bin/python examples/quickstart.py
echo "demo: every notebook in notebooks/, in the actormesh kernel"
.venv/bin/python scripts/run_notebooks.py
echo "demo: done. Next, open the notebooks yourself: .venv/bin/jupyter lab notebooks/"
