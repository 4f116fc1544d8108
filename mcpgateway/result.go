package mcpgateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/ledger"
)

// recordLimit is the size of a recorded result, as JSON, beyond which
// only a note that the call succeeded is recorded (the ledger's limit,
// less room for escaping).
const recordLimit = ledger.MaxResultDataLen - 4<<10

// record returns what the ledger records of an upstream's result: the
// CallToolResult as the gateway returns it (the SDK reads its numbers as
// doubles), and the resource id the policy points at. A result the ledger
// would refuse (over its size limit, or nested deeper than
// fingerprint.MaxDepth) is recorded as a note that the call succeeded.
func record(res *mcp.CallToolResult, resourceID string) client.Result {
	out := client.Result{ResourceID: pointString(res.StructuredContent, resourceID)}
	b, err := json.Marshal(res)
	if err == nil && len(b) > recordLimit {
		out.Data = notKept(fmt.Sprintf("(%d bytes) was too large", len(b)))
		return out
	}
	if err == nil {
		err = json.Unmarshal(b, &out.Data)
	}
	if err == nil {
		_, err = fingerprint.Canonical(out.Data)
	}
	if err != nil {
		out.Data = notKept("was nested too deeply")
	}
	return out
}

// notKept is recorded in place of a result the ledger would refuse; why
// says what was wrong with it.
func notKept(why string) map[string]any {
	return map[string]any{"content": []any{map[string]any{
		"type": "text",
		"text": "The call succeeded. Its result " + why + " for the ledger to keep, so this replay cannot show it.",
	}}}
}

// replayed rebuilds a recorded result as a CallToolResult: the one the
// upstream returned, or, for data a reconciler or operator recorded, that
// data as structured content with its resource id beside it, or without
// it when the data alone is what the tool's output schema describes. The
// text has both.
func replayed(r client.Result, schema *outputCheck) *mcp.CallToolResult {
	var res mcp.CallToolResult
	if _, ok := r.Data["content"].([]any); ok {
		if b, err := json.Marshal(r.Data); err == nil && json.Unmarshal(b, &res) == nil {
			return &res
		}
	}
	data := map[string]any{}
	for k, v := range r.Data {
		data[k] = v
	}
	if r.ResourceID != "" {
		data["resourceId"] = r.ResourceID
	}
	b, _ := json.Marshal(data)
	res.Content = []mcp.Content{&mcp.TextContent{Text: string(b)}}
	res.StructuredContent = data
	if r.ResourceID != "" && fits(schema, r.Data) {
		res.StructuredContent = r.Data
	}
	return &res
}

// fitted returns a call's result as a client that checks the tool's output
// schema (the official SDKs do) takes it, and why its structured content
// was not kept ("" when it was: misfit). It is as it is when there is no
// schema or its structured content fits, or an error without structured
// content; an error without the structured content otherwise. Otherwise,
// for a call that succeeded (the tool answered another shape, a
// reconciliation recorded one, it was too large to keep, or too costly to
// check), it is the result's text alone, as an error result that says the
// call succeeded and is not run again.
func fitted(res *mcp.CallToolResult, o *outputCheck) (*mcp.CallToolResult, string) {
	if o == nil {
		return res, ""
	}
	why := misfitMissing
	if res.StructuredContent != nil {
		why = o.misfit(res.StructuredContent)
	}
	switch {
	case why == "" || res.IsError && res.StructuredContent == nil:
		return res, ""
	case res.IsError:
		c := *res // the TypeScript client checks an error's structured content too, and throws
		c.StructuredContent = nil
		return &c, why
	}
	body := errorText(res)
	if body == "" && res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		body = string(b)
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "This call ran and " +
		"succeeded, and it will not run again under this key: do not call the tool again to redo it. Its result is " +
		"not in the shape the tool's output schema describes (the tool answered so, a reconciliation recorded it, " +
		"it was too large to keep, or too costly to check), so it is given here as text:\n" + body}}}, why
}

// errorText is the text of an isError result that the ledger keeps as its
// failure's detail (out of pages and logs: it may quote the arguments).
func errorText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// failed rebuilds a recorded failure as an isError result: the tool's text
// (the detail), else the message a reconciler gave, else its code.
func failed(f *client.FailedError) *mcp.CallToolResult {
	text := f.Detail
	if text == "" {
		text = f.Message
	}
	if text == "" {
		text = "The tool failed (" + f.Code + ")."
		if f.Reason == "RETRIES_EXHAUSTED" {
			text = "The operation ran out of attempts: it will not run again under this key."
		}
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

// decodeObject decodes a JSON object, keeping numbers as json.Number.
func decodeObject(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return m, nil
}

// selectParams returns the values of args that the pointers name, keyed by
// pointer (the object the ledger fingerprints); args itself without
// pointers.
func selectParams(args map[string]any, pointers []string) map[string]any {
	if len(pointers) == 0 {
		return args
	}
	out := map[string]any{}
	for _, p := range pointers {
		if v, ok := fingerprint.Resolve(args, p); ok {
			out[p] = v
		}
	}
	return out
}

// pointString is the value at p in v as a resource id: a string the
// ledger takes as one (ledger.ValidateResourceID), or a number as written;
// "" when there is none.
func pointString(v any, p string) string {
	if p == "" || v == nil {
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return ""
	}
	m, _ := v.(map[string]any)
	x, _ := fingerprint.Resolve(m, p)
	switch x := x.(type) {
	case string:
		if ledger.ValidateResourceID(x) == nil {
			return x
		}
	case json.Number:
		return x.String()
	}
	return ""
}
