// A real MCP client (the official TypeScript SDK, @modelcontextprotocol/sdk) driven by a script of
// operations; the same script format as python_client.py (see there). The Rust test
// crates/gateway/tests/clients.rs writes the script and asserts on what this prints.
//
//   node ts_client.mjs SCRIPT.json
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

// Run from beside the installed node_modules (see clients.rs), so the SDK's own package.json is here.
const sdkVersion = JSON.parse(
  readFileSync(new URL("./node_modules/@modelcontextprotocol/sdk/package.json", import.meta.url), "utf8"),
).version;

async function runOps(client, ops) {
  const results = [];
  for (const op of ops) {
    if (op.op === "list") {
      const listed = await client.listTools();
      results.push({ tools: listed.tools });
    } else if (op.op === "call") {
      const params = { name: op.name, arguments: op.arguments ?? {} };
      if (op.meta) params._meta = op.meta;
      if (op.progress) {
        // As the SDK's README shows: an onprogress callback (the SDK adds the progress token).
        const progress = [];
        const result = await client.callTool(params, undefined, { onprogress: (p) => progress.push(p) });
        results.push({ ...result, progress });
      } else {
        results.push(await client.callTool(params));
      }
    } else {
      throw new Error(`unknown op ${op.op}`);
    }
  }
  return {
    server: client.getServerVersion(),
    protocol: client.transport?.protocolVersion,
    results,
  };
}

const script = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = { sdk: `@modelcontextprotocol/sdk ${sdkVersion}`, sessions: [] };
for (const s of script.sessions) {
  let transport;
  if (script.transport === "http") {
    transport = new StreamableHTTPClientTransport(new URL(script.url), {
      requestInit: { headers: { Authorization: `Bearer ${s.bearer}` } },
    });
  } else if (script.transport === "stdio") {
    transport = new StdioClientTransport({
      command: script.command,
      args: script.args ?? [],
      env: { ...process.env, ...(script.env ?? {}) },
      stderr: "inherit",
    });
  } else {
    throw new Error(`unknown transport ${script.transport}`);
  }
  const client = new Client({ name: "toolgate-ts-client-test", version: "0.1.0" });
  await client.connect(transport);
  out.sessions.push(await runOps(client, s.ops));
  await client.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
