#!/usr/bin/env bash
# Installs the browser the approval page's end-to-end tests drive: Debian's `chromium` and
# `chromium-driver` (WebDriver). Idempotent: does nothing when /usr/bin/chromium and
# /usr/bin/chromedriver are already there; otherwise runs `apt-get update` once, then installs.
# Needs root (or sudo). Prints the two paths the tests use.
set -euo pipefail

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
  echo "chromium and chromedriver already installed"
else
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "installing chromium and chromium-driver with apt-get"
  $SUDO apt-get update
  $SUDO apt-get install -y --no-install-recommends chromium chromium-driver
fi

echo "chromium:     $(command -v chromium || echo /usr/bin/chromium)"
echo "chromedriver: $(command -v chromedriver || echo /usr/bin/chromedriver)"
/usr/bin/chromium --version 2>/dev/null || true
