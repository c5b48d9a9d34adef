#!/usr/bin/env bash
# The load generator and the reverse proxy `toolgate-bench peers` compares toolgate with:
# Debian's wrk and haproxy. Idempotent; needs root (or sudo) for apt-get. Not part of CI.
set -euo pipefail
missing=()
for tool in wrk haproxy; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "wrk and haproxy are installed"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get install -y "${missing[@]}" || { $sudo apt-get update && $sudo apt-get install -y "${missing[@]}"; }
