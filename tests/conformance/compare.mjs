// Compares two conformance result folders (`conformance server -o DIR`): every scenario that
// passes against the fixture server alone must pass through toolgate, unless it is listed in
// the exclusions file with a reason. Exit 1 otherwise.
// Usage: node compare.mjs <alone-dir> <through-dir> <exclusions.txt>
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

const [alone, through, exclusionsFile] = process.argv.slice(2);

function results(dir) {
  const out = new Map();
  for (const d of readdirSync(dir)) {
    const m = d.match(/^server-(.+)-\d{4}-\d{2}-\d{2}T/);
    if (!m) continue;
    const checks = JSON.parse(readFileSync(join(dir, d, "checks.json"), "utf8"));
    const ok = checks.length > 0 && checks.every((c) => c.status === "SUCCESS" || c.status === "INFO" || c.status === "WARNING");
    out.set(m[1], ok);
  }
  return out;
}

const excluded = new Map(
  readFileSync(exclusionsFile, "utf8").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"))
    .map((l) => { const [name, ...why] = l.split(/\s+#\s*|\s+/); return [name, l.slice(name.length).replace(/^\s*#?\s*/, "")]; }),
);
const a = results(alone);
const b = results(through);
let failed = 0;
console.log("scenario                              alone    toolgate");
for (const [name, okAlone] of [...a].sort()) {
  const okThrough = b.get(name) ?? false;
  let note = "";
  if (okAlone && !okThrough) {
    if (excluded.has(name)) note = `excluded: ${excluded.get(name)}`;
    else { note = "REGRESSION"; failed++; }
  }
  console.log(`${name.padEnd(38)}${(okAlone ? "pass" : "fail").padEnd(9)}${(okThrough ? "pass" : "fail").padEnd(9)}${note}`);
}
const passAlone = [...a.values()].filter(Boolean).length;
const passThrough = [...a].filter(([n, ok]) => ok && b.get(n)).length;
console.log(`\n${passThrough}/${passAlone} scenarios that pass alone also pass through toolgate; ${failed} regression(s)`);
process.exit(failed ? 1 : 0);
