// Calls, through the MCP gateway, the demo desk's create_ticket under keys
// whose operations an operator settled: one with data in the ticket's
// shape, one with data of another shape. The client is the official
// TypeScript SDK, which checks each answer against the tool's output
// schema and throws on one that does not fit.
//
//   node schema_answers.mjs URL SDK_DIR KEY_SHAPED KEY_OTHER
//
// Prints "PASS: schema answers", or fails with what the client got.
import path from "node:path";
import { pathToFileURL } from "node:url";

const [url, sdk, shaped, other] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist", "esm", p)).href);
const { Client } = await load("client/index.js");
const { StreamableHTTPClientTransport } = await load("client/streamableHttp.js");

const client = new Client({ name: "schema-answers", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const { tools } = await client.listTools();
const create = tools.find((t) => t.name === "tickets_create_ticket");
if (!create?.outputSchema) {
  console.error("FAIL: tickets_create_ticket lists no output schema");
  process.exit(1);
}
const call = (key) => client.callTool({
  name: "tickets_create_ticket", arguments: { title: "Printer on fire", priority: 2 }, _meta: { idempotencyKey: key },
});
const text = (res) => res.content.map((c) => c.text ?? "").join("");
const outcome = (res) => res._meta?.["io.github.opledger/ledger"]?.outcome;

const a = await call(shaped);
console.log(`shaped: isError=${a.isError ?? false} outcome=${outcome(a)} id=${a.structuredContent?.id}`);
const b = await call(other);
console.log(`other: isError=${b.isError ?? false} outcome=${outcome(b)} text=${text(b).split(":")[0]}`);
await client.close();
if (a.isError || a.structuredContent?.id !== "TCK-9" || outcome(a) !== "replayed") {
  console.error("FAIL: data in the ticket's shape is not replayed as the ticket");
  process.exit(1);
}
if (!b.isError || !text(b).includes("ran and succeeded") || !text(b).includes('"ticket":"TCK-9"') || outcome(b) !== "replayed") {
  console.error("FAIL: data of another shape is not replayed as text that says the call succeeded");
  process.exit(1);
}
console.log("PASS: schema answers");
