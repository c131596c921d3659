// `spillway mcp` spoken to by the official TypeScript MCP SDK, announcing itself as each host
// (its `clientInfo.name` in `initialize`): `run` with 2 MB on both streams answers within that
// host's budget (the whole serialized result), the text once, and the digest pages the rest.
// Prints `N passed, N failed`.
// Usage: node mcp_hosts.mjs SPILLWAY_BINARY STORE_URL TOKEN   (with NODE_PATH at the SDK's node_modules)
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH ?? ".", "noop.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = require("@modelcontextprotocol/sdk/client/stdio.js");

const [binary, url, token] = process.argv.slice(2);
const TWO_MB_EACH = "head -c 2000000 /dev/urandom | base64 -w 76; head -c 2000000 /dev/urandom | base64 -w 76 >&2";
let passed = 0;
let failed = 0;
function check(name, ok, detail = "") {
  if (ok) {
    passed++;
    console.log(`ok   ${name}`);
  } else {
    failed++;
    console.log(`FAIL ${name}: ${JSON.stringify(detail).slice(0, 300)}`);
  }
}
const text = (r) => (r.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
const wire = (r) => Buffer.byteLength(JSON.stringify(r));

for (const [name, budget, extra] of [
  ["claude-code", 40_000, []],
  ["codex", 9_000, []],
  ["an-unknown-host", 100_000, []],
  ["codex", 30_000, ["--limit", "30000"]],
]) {
  const who = `${name}${extra.length ? " " + extra.join(" ") : ""}`;
  const transport = new StdioClientTransport({
    command: binary,
    args: ["mcp", ...extra],
    env: { ...process.env, SPILLWAY_URL: url, SPILLWAY_TOKEN: token },
    stderr: "ignore",
  });
  const client = new Client({ name, version: "1.0.0" });
  try {
    await client.connect(transport);
    const r = await client.callTool({ name: "run", arguments: { command: TWO_MB_EACH } });
    check(`${who}: run within ${budget}`, !r.isError && wire(r) <= budget, wire(r));
    check(`${who}: the text once`, r.structuredContent === undefined && r.content.length === 1, Object.keys(r));
    const answer = JSON.parse(text(r));
    const saved = [answer.stdout, answer.stderr].every((x) => x.truncated && x.saved && x.shown.length === 2);
    check(`${who}: both streams cut head and tail, saved`, saved, [answer.stdout.shown, answer.stderr.shown]);
    const page = await client.callTool({ name: "read", arguments: { digest: answer.stderr.digest, line: 30000 } });
    check(`${who}: the digest pages the rest, within ${budget}`,
      !page.isError && wire(page) <= budget && text(page).includes("continue with line="), wire(page));
    const tail = await client.callTool({ name: "read", arguments: { digest: answer.stdout.digest, tail_lines: 100000 } });
    check(`${who}: a tail within ${budget}, ending at the end`,
      !tail.isError && wire(tail) <= budget && text(tail).includes("end of output"), text(tail).slice(-200));
  } catch (e) {
    check(`${who}: the session completes`, false, String(e));
  } finally {
    await client.close();
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
