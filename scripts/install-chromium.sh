#!/usr/bin/env bash
# Installs Debian's chromium for the browser check (tests/browser/), once; later runs return at once.
# The test drives /usr/bin/chromium itself (no Playwright browser download), so this is all it needs.
set -euo pipefail

if command -v chromium >/dev/null 2>&1; then
  echo "chromium already installed: $(chromium --version 2>/dev/null || command -v chromium)"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
else
  sudo_cmd=()
fi

start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
echo "installed $(chromium --version 2>/dev/null) in $(( $(date +%s) - start ))s"
