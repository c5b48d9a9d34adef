"""A real MCP client (the official Python SDK, `mcp`) driven by a script of operations.

The Rust test `crates/gateway/tests/clients.rs` writes the script; this file only carries it out
with the SDK and prints what came back, so the assertions live in one place. Usage:

    python python_client.py SCRIPT.json

SCRIPT: {"transport": "http", "url": ..., "client": "legacy" | "modern",
         "sessions": [{"bearer": KEY, "ops": [...]}]}
     or {"transport": "stdio", "command": ..., "args": [...], "env": {...}, "sessions": [{"ops": [...]}]}
client: "legacy" (the default) is a `ClientSession` with the `initialize` handshake (2025-11-25,
        a stateful HTTP session); "modern" is `mcp.Client` as the SDK's README shows it, which
        discovers the server and speaks 2026-07-28 (stateless: no session, every request alone).
op:     {"op": "list"} | {"op": "call", "name": ..., "arguments": {...}, "meta": {...}}
Prints: {"sdk": ..., "sessions": [{"server": {...}, "results": [...]}]} on stdout.
"""

import json
import sys
from importlib.metadata import version

import anyio
import httpx2
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


async def run_ops(session: ClientSession, ops):
    init = await session.initialize()
    results = []
    for op in ops:
        if op["op"] == "list":
            listed = await session.list_tools()
            results.append({"tools": [dump(t) for t in listed.tools]})
        elif op["op"] == "call":
            r = await session.call_tool(op["name"], op.get("arguments") or {}, meta=op.get("meta"))
            results.append(dump(r))
        else:
            raise ValueError(f"unknown op {op['op']}")
    return {"server": dump(init.server_info), "protocol": init.protocol_version, "results": results}


async def run_modern(client: Client, ops):
    results = []
    for op in ops:
        if op["op"] == "list":
            listed = await client.list_tools()
            results.append({"tools": [dump(t) for t in listed.tools]})
        elif op["op"] == "call":
            r = await client.call_tool(op["name"], op.get("arguments") or {}, meta=op.get("meta"))
            results.append(dump(r))
        else:
            raise ValueError(f"unknown op {op['op']}")
    info = client.server_info
    return {"server": dump(info) if info else {}, "protocol": client.protocol_version, "results": results}


async def main(path: str):
    with open(path) as f:
        script = json.load(f)
    out = {"sdk": f"mcp {version('mcp')}", "sessions": []}
    for s in script["sessions"]:
        if script["transport"] == "http":
            headers = {"Authorization": f"Bearer {s['bearer']}"}
            async with create_mcp_http_client(headers=headers) as http:
                if script.get("client", "legacy") == "modern":
                    async with Client(streamable_http_client(script["url"], http_client=http)) as client:
                        out["sessions"].append(await run_modern(client, s["ops"]))
                    continue
                async with streamable_http_client(script["url"], http_client=http) as (read, write):
                    async with ClientSession(read, write) as session:
                        out["sessions"].append(await run_ops(session, s["ops"]))
        elif script["transport"] == "stdio":
            params = StdioServerParameters(
                command=script["command"], args=script.get("args", []), env=script.get("env")
            )
            async with stdio_client(params) as (read, write):
                async with ClientSession(read, write) as session:
                    out["sessions"].append(await run_ops(session, s["ops"]))
        else:
            raise ValueError(f"unknown transport {script['transport']}")
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])
