#!/usr/bin/env bash
# Install Slurm and munge from Debian's packages (for the Slurm integration test; needs root).
# No daemon is started: scripts/slurm/up.sh starts them on fake hosts.
set -euo pipefail
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
