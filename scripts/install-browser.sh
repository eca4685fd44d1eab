#!/usr/bin/env bash
# What the sidebar needs beyond Python: node (to build labextension/ inside `pip install`) and
# Debian's chromium (for the browser tests in tests/ui). Installs them with apt-get when missing.
set -euo pipefail
missing=()
command -v node >/dev/null || missing+=(nodejs npm)
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium chromium-driver fonts-dejavu-core)
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null; then
  echo "missing ${missing[*]} and no apt-get: install them (or set CHROMIUM to a chromium binary)" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
