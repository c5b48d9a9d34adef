// Writes a toolgate registry folder that puts an MCP server behind toolgate with every tool it
// lists declared as a read tool for one test principal, the input schema copied verbatim.
// Usage: node gen-registry.mjs <server-url> <out-dir> <api-key> <upstream-command> [args...]
// With `--url` as the upstream command, toolgate reaches the server at <server-url> over
// streamable HTTP instead of starting it.
import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const [url, out, key, command, ...args] = process.argv.slice(2);

async function rpc(body, session) {
  const headers = { "content-type": "application/json", accept: "application/json, text/event-stream" };
  if (session) headers["mcp-session-id"] = session;
  const r = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
  const text = await r.text();
  const sid = r.headers.get("mcp-session-id") ?? session;
  if (!body.id) return { sid };
  const line = (r.headers.get("content-type") ?? "").includes("event-stream")
    ? text.split("\n").filter((l) => l.startsWith("data: {")).map((l) => l.slice(6)).find((l) => JSON.parse(l).id === body.id)
    : text;
  return { sid, msg: JSON.parse(line) };
}

const init = await rpc({ jsonrpc: "2.0", id: 1, method: "initialize", params: {
  protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "gen-registry", version: "0" } } });
await rpc({ jsonrpc: "2.0", method: "notifications/initialized" }, init.sid);
const list = await rpc({ jsonrpc: "2.0", id: 2, method: "tools/list", params: {} }, init.sid);
const tools = list.msg.result.tools;

const q = JSON.stringify; // JSON is YAML
mkdirSync(join(out, "tools"), { recursive: true });
writeFileSync(join(out, "toolgate.yaml"), [
  "label: conformance-through-toolgate",
  "store:",
  "  url: \"sqlite://conformance.db\"",
  "upstreams:",
  "  fixture:",
  ...(command === "--url" ? [`    url: ${q(url)}`] : [`    command: ${q(command)}`, `    args: ${q(args)}`]),
  "    package: \"toolgate-fakes@0.1.0\"",
  "    timeout_secs: 30",
  "",
].join("\n"));
writeFileSync(join(out, "principals.yaml"), [
  "roles:",
  "  conformance: {description: \"the conformance suite's client\"}",
  "principals:",
  "  - id: conformance-client",
  "    kind: agent",
  "    role: conformance",
  "    credentials:",
  `      - {id: test, sha256: "sha256:${createHash("sha256").update(key).digest("hex")}"}`,
  "    grants:",
  "      - scopes: [fixtures:read]",
  "        purposes: [conformance]",
  "        max_tier: read",
  "        max_sensitivity: internal",
  "",
].join("\n"));
const decls = tools.map((t) => ({
  name: t.name,
  version: "1.0.0",
  owner: "@toolgate/conformance",
  description: t.description ?? t.name,
  effect: "read",
  tier: "read",
  sensitivity: "internal",
  scopes: ["fixtures:read"],
  purposes: ["conformance"],
  roles: ["conformance"],
  handler: { upstream: "fixture", tool: t.name },
  input_schema: t.inputSchema,
}));
writeFileSync(join(out, "tools", "fixtures.yaml"), q({ tools: decls }, null, 1) + "\n");
console.log(`wrote ${decls.length} tools to ${out}`);
