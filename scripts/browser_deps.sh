#!/usr/bin/env bash
# Headless Chromium and its WebDriver from the Debian packages, for the approval page's browser
# tests (tests/browser). Idempotent: returns at once when both are installed.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  echo "browser: $(chromium --version 2>/dev/null || echo chromium) and chromedriver present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "browser: chromium and chromium-driver are missing; install them as root:" \
    "apt-get install chromium chromium-driver" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
echo "browser: installed $(chromium --version)"
