// A ticket desk on the official TypeScript MCP SDK, written as its
// examples are: the upstream of TestMCPNodeUpstream, behind the gateway.
//
//   node tickets_server.mjs SDK_DIR EFFECTS MODE [PORT]
//
// create_ticket applies an effect for every call it gets (a line appended
// to the file EFFECTS) and answers the ticket; with the title "drop" it
// applies the effect and never answers. find_ticket answers the ticket
// made under an idempotency key, or {"found": false}.
//
// MODE is how it is served: "stdio"; or over Streamable HTTP on
// 127.0.0.1:PORT (0: any free port; it prints the JSON line {"msg":
// "tickets serving", "listen": "127.0.0.1:N"} once it listens), "http"
// with sessions and event streams, "json" with sessions and JSON answers,
// "stateless" with neither sessions nor event streams. A request naming a
// session the server does not hold is answered 404, as the SDK's examples
// answer it now; "http-400" is "http" answering it 400, as servers written
// from the SDK's earlier README do.
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [sdk, effects, mode, port = "0"] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdk, "dist", "esm", p)).href);
const { McpServer } = await load("server/mcp.js");
const { StdioServerTransport } = await load("server/stdio.js");
const { StreamableHTTPServerTransport } = await load("server/streamableHttp.js");
const { isInitializeRequest } = await load("types.js");
const { z } = await import(pathToFileURL(createRequire(path.join(sdk, "package.json")).resolve("zod")).href);

const applied = () =>
  fs.existsSync(effects) ? fs.readFileSync(effects, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) : [];

function desk() {
  const server = new McpServer({ name: "tickets", version: "1.0.0" });
  server.registerTool("create_ticket", {
    description: "Open a support ticket.",
    inputSchema: { title: z.string(), priority: z.number().int().optional() },
    outputSchema: { id: z.string(), title: z.string() },
  }, async ({ title }, extra) => {
    const key = extra._meta?.idempotencyKey ?? "";
    const id = `T-${applied().length + 1}`;
    fs.appendFileSync(effects, JSON.stringify({ key, id, title }) + "\n");
    if (title === "drop") await new Promise(() => {});
    return { content: [{ type: "text", text: `Opened ticket ${id}.` }], structuredContent: { id, title } };
  });
  server.registerTool("find_ticket", {
    description: "Find the ticket opened under an idempotency key.",
    inputSchema: { idempotency_key: z.string() },
    annotations: { readOnlyHint: true },
  }, async ({ idempotency_key: key }) => {
    const e = applied().find((x) => x.key === key);
    if (!e) return { content: [{ type: "text", text: "No such ticket." }], structuredContent: { found: false } };
    return { content: [{ type: "text", text: `Opened ticket ${e.id}.` }], structuredContent: { id: e.id, title: e.title } };
  });
  return server;
}

if (mode === "stdio") {
  await desk().connect(new StdioServerTransport());
} else {
  const sessions = new Map();
  const read = async (req) => {
    let body = "";
    for await (const chunk of req) body += chunk;
    return body ? JSON.parse(body) : undefined;
  };
  const refuse = (res, status, code, message) =>
    res.writeHead(status, { "Content-Type": "application/json" }).end(JSON.stringify({ jsonrpc: "2.0", error: { code, message }, id: null }));
  const srv = http.createServer(async (req, res) => {
    const body = req.method === "POST" ? await read(req) : undefined;
    if (mode === "stateless") {
      const t = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      res.on("close", () => t.close());
      await desk().connect(t);
      await t.handleRequest(req, res, body);
      return;
    }
    const sid = req.headers["mcp-session-id"];
    let t = sid ? sessions.get(sid) : undefined;
    if (!t && !sid && isInitializeRequest(body)) {
      t = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: mode === "json",
        onsessioninitialized: (id) => sessions.set(id, t),
      });
      t.onclose = () => sessions.delete(t.sessionId);
      await desk().connect(t);
    }
    if (!t && sid && mode !== "http-400") return refuse(res, 404, -32001, "Session not found");
    if (!t) return refuse(res, 400, -32000, "Bad Request: No valid session ID provided");
    await t.handleRequest(req, res, body);
  });
  srv.listen(Number(port), "127.0.0.1", () =>
    console.log(JSON.stringify({ msg: "tickets serving", listen: `127.0.0.1:${srv.address().port}` })));
}
