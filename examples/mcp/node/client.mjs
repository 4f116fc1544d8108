// An MCP client on the official TypeScript SDK, calling the demo ticket
// desk through the ledger's MCP gateway (examples/mcp). It has no ledger
// code: what keeps the effect single is the gateway.
//
//   node client.mjs [http://127.0.0.1:8931/mcp]
//
// LEDGER_API_KEY, when set, is sent as the Bearer token (a gateway in
// front of a ledgerd with authentication). It prints what each call got
// and ends with "PASS: mcp example", or fails with the check that did not
// hold.
import { randomUUID } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2] ?? "http://127.0.0.1:8931/mcp");
const headers = process.env.LEDGER_API_KEY ? { Authorization: `Bearer ${process.env.LEDGER_API_KEY}` } : {};
const client = new Client({ name: "ledger-mcp-example", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }));

const ledger = (res) => res._meta?.["io.github.opledger/ledger"] ?? {};
const text = (res) => res.content.map((c) => c.text ?? "").join("");
function check(ok, what) {
  if (!ok) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
}
function show(label, ...answers) {
  const res = answers[0];
  const t = res.isError ? text(res).split(":")[0] : res.structuredContent?.id;
  const outcomes = answers.map((r) => ledger(r).outcome).sort().join("+");
  console.log(`${label.padEnd(34)} ${outcomes.padEnd(17)} ${t}`);
}
const create = (args, key) =>
  client.callTool({ name: "tickets_create_ticket", arguments: args, _meta: key ? { idempotencyKey: key } : undefined });

const count = async () =>
  (await client.callTool({ name: "tickets_list_tickets", arguments: {} })).structuredContent.tickets.length;

const { tools } = await client.listTools();
console.log("tools:", tools.map((t) => t.name).sort().join(" "));
check(tools.some((t) => t.name === "tickets_create_ticket"), "the gateway lists tickets_create_ticket");

const before = await count();

// One intent, minted once: sent three times, twice at once.
const key = `demo-${randomUUID()}`;
const printer = { title: "Printer on fire", priority: 2 };
const [a, b] = await Promise.all([create(printer, key), create(printer, key)]);
show("create (key K), twice at once", a, b);
const c = await create(printer, key);
show("create (key K), again", c);
const ids = new Set([a, b, c].map((r) => r.structuredContent?.id));
check(ids.size === 1 && !ids.has(undefined), "three calls under one key answer one ticket");
check([a, b, c].filter((r) => ledger(r).outcome === "executed").length === 1, "one of them executed, the others replayed");

// The same key with a changed request: refused, never forwarded.
const changed = await create({ title: "Printer on fire", priority: 1 }, key);
show("create (key K), priority changed", changed);
check(changed.isError && ledger(changed).outcome === "key_reused", "a changed request under the key is refused");

// No key: the gateway derives one from this session and the arguments.
const d = await create({ title: "Coffee machine empty", priority: 4 });
const e = await create({ title: "Coffee machine empty", priority: 4 });
show("create (no key)", d);
show("create (no key, again)", e);
check(d.structuredContent?.id === e.structuredContent?.id && ledger(e).outcome === "replayed", "a repeat without a key is a replay");

const opened = (await count()) - before;
console.log(`tickets opened: ${opened}`);
check(opened === 2, "the desk opened two tickets");

await client.close();
console.log("PASS: mcp example");
