#!/usr/bin/env bash
# Installs the third-party MCP servers that toolgate's contract tests audit, at the exact versions
# pinned in tests/third-party/ (package.json + package-lock.json for npm, requirements.txt +
# constraints.txt for PyPI), into .tools/third-party/ (git-ignored). Idempotent: a second run with
# unchanged pins does nothing. Prints the paths the tests read.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
pins="$root/tests/third-party"
dest="$root/.tools/third-party"
mkdir -p "$dest"

stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# npm servers: `npm ci` from the committed lock, so every transitive version is the reviewed one.
npm_stamp="$(stamp_of "$pins/package.json" "$pins/package-lock.json")"
if [ "$(cat "$dest/.npm-stamp" 2>/dev/null || true)" != "$npm_stamp" ]; then
  echo "installing npm MCP servers into $dest"
  cp "$pins/package.json" "$pins/package-lock.json" "$dest/"
  (cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund)
  echo "$npm_stamp" > "$dest/.npm-stamp"
else
  echo "npm MCP servers already installed (pins unchanged)"
fi

# PyPI servers: a venv with the requirement and every transitive package constrained.
py_stamp="$(stamp_of "$pins/requirements.txt" "$pins/constraints.txt")"
if [ "$(cat "$dest/.pypi-stamp" 2>/dev/null || true)" != "$py_stamp" ] || [ ! -x "$dest/venv/bin/mcp-server-time" ]; then
  echo "installing PyPI MCP servers into $dest/venv"
  python3 -m venv "$dest/venv"
  "$dest/venv/bin/pip" install --quiet --disable-pip-version-check \
    -r "$pins/requirements.txt" -c "$pins/constraints.txt"
  echo "$py_stamp" > "$dest/.pypi-stamp"
else
  echo "PyPI MCP servers already installed (pins unchanged)"
fi

# Each server must start under the Node on PATH; the contract tests spawn them from here.
for s in everything filesystem memory; do
  test -f "$dest/node_modules/@modelcontextprotocol/server-$s/dist/index.js" \
    || { echo "missing server-$s after install" >&2; exit 1; }
done
test -x "$dest/venv/bin/mcp-server-time" || { echo "missing mcp-server-time after install" >&2; exit 1; }
echo "third-party MCP servers ready in $dest"
