// The conformance suite connects without credentials and states no purpose. This adapter plays
// a governed client in front of toolgate: it adds `Authorization: Bearer <key>` to every request
// and `_meta.purpose` / `_meta.reason` to every tools/call, and streams everything else through
// unchanged (Host included, so toolgate's DNS-rebinding protection is what the suite tests).
// Usage: node auth-proxy.mjs <listen-port> <toolgate-origin> <api-key>
import http from "node:http";

const [port, target, key] = process.argv.slice(2);
const upstream = new URL(target);

function addPurpose(msg) {
  if (msg && msg.method === "tools/call") {
    msg.params ??= {};
    msg.params._meta = { purpose: "conformance", reason: "MCP conformance scenario", ...(msg.params._meta ?? {}) };
  }
  return msg;
}

http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    let body = Buffer.concat(chunks);
    if (req.method === "POST" && body.length) {
      try {
        const msg = JSON.parse(body.toString());
        body = Buffer.from(JSON.stringify(Array.isArray(msg) ? msg.map(addPurpose) : addPurpose(msg)));
      } catch { /* not JSON: pass through for toolgate to refuse */ }
    }
    const headers = { ...req.headers, authorization: `Bearer ${key}` };
    if (body.length || req.headers["content-length"]) headers["content-length"] = String(body.length);
    const out = http.request({ host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers }, (up) => {
      res.writeHead(up.statusCode, up.headers);
      up.pipe(res);
    });
    out.on("error", (e) => { res.writeHead(502); res.end(String(e)); });
    res.on("close", () => out.destroy());
    out.end(body);
  });
}).listen(Number(port), "127.0.0.1", () => console.error(`auth proxy on ${port} → ${target}`));
