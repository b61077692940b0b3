#!/usr/bin/env bash
# The system packages the test tiers drive: headless Chromium and its WebDriver (the approval
# pages' browser tests, tests/e2e) and strace (the key file's sync counts,
# tests/integration/test_key_file_syncs.py), from Debian. Idempotent: returns at once when all
# are installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
  && command -v strace >/dev/null 2>&1; then
  echo "system deps: $(chromium --version 2>/dev/null || echo chromium), chromedriver and strace present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "system deps: chromium, chromium-driver or strace is missing; install them as root:" \
    "apt-get install chromium chromium-driver strace" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver strace >/dev/null
echo "system deps: installed $(chromium --version) and $(strace -V | head -1)"
