// Package mcpgateway puts the operation ledger in front of MCP servers'
// tools. It serves their tools over MCP (stdio or Streamable HTTP) and
// runs every call through the ledger with the client SDK's Do: a call
// that repeats an operation is answered from its record instead of
// forwarded again, a changed request under a key is refused, and an
// ambiguous outcome is reconciled before anything runs again.
//
// A call's operation id comes from its _meta (MetaIdempotencyKey or
// MetaOperationID). Without one, the tool's key mode decides: session
// derives it from the session (or run), the tool and the consequential
// arguments within a dedupe window; require refuses the call; none
// forwards a read-only tool unrecorded. docs/mcp.md has the decision
// table and what the gateway can and cannot promise.
package mcpgateway
