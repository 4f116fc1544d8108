package mcpgateway

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/ledger"
)

// TestRecordReplays: what the ledger records of a result replays as that
// result, through the wire's Struct: text and structured content, _meta,
// a number as its resource id, and a result over the ledger's size or
// depth limit (a note that the call succeeded).
func TestRecordReplays(t *testing.T) {
	big := strings.Repeat("x", recordLimit)
	// trace is a _meta of a result whose data nests depth levels.
	trace := func(depth int) string {
		n := depth - 2 // data and its _meta
		return `{"_meta":{"trace":` + strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) + `},"content":[]}`
	}
	for _, tc := range []struct {
		name   string
		result string
		ptr    string
		rid    string
		exact  bool // the replay is the result, byte for byte as JSON
		says   string
	}{
		{name: "text and structure", result: `{"content":[{"type":"text","text":"Opened T-1."}],"structuredContent":{"id":"T-1","n":2}}`, ptr: "/id", rid: "T-1", exact: true},
		{name: "meta and image", result: `{"_meta":{"x":1},"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`, exact: true},
		{name: "numeric id", result: `{"content":[],"structuredContent":{"id":12345}}`, ptr: "/id", rid: "12345", exact: true},
		{name: "an id with a control character", result: `{"content":[],"structuredContent":{"id":"T-1\n"}}`, ptr: "/id", exact: true},
		{name: "an id too long", result: `{"content":[],"structuredContent":{"id":"` + strings.Repeat("x", 257) + `"}}`, ptr: "/id", exact: true},
		{name: "too large", result: `{"content":[{"type":"text","text":"` + big + `"}]}`, says: "too large for the ledger to keep"},
		{name: "as deep as kept", result: trace(fingerprint.MaxDepth), exact: true},
		{name: "too deep", result: trace(fingerprint.MaxDepth + 1), says: "nested too deeply for the ledger to keep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var res mcp.CallToolResult
			if err := json.Unmarshal([]byte(tc.result), &res); err != nil {
				t.Fatal(err)
			}
			r := record(&res, tc.ptr)
			if r.ResourceID != tc.rid {
				t.Errorf("resource id %q, want %q", r.ResourceID, tc.rid)
			}
			s, err := structpb.NewStruct(r.Data) // what the wire carries
			if err != nil {
				t.Fatal(err)
			}
			if b, _ := json.Marshal(r.Data); len(b) > recordLimit {
				t.Fatalf("%d bytes recorded, over the limit", len(b))
			}
			got := replayed(client.Result{Data: s.AsMap(), ResourceID: r.ResourceID}, nil)
			want, _ := json.Marshal(&res)
			if b, _ := json.Marshal(got); tc.exact && string(b) != string(want) {
				t.Errorf("replay\n%s\nwant\n%s", b, want)
			}
			if tc.says != "" && !strings.Contains(errorTextOf(got), tc.says) {
				t.Errorf("replay %q does not say %q", errorTextOf(got), tc.says)
			}
		})
	}
}

// TestReplayedOperatorData: data an operator or reconciler recorded,
// which is no CallToolResult, replays as structured content with its
// resource id, or without it when the data alone is what the tool's output
// schema describes; the text has both.
func TestReplayedOperatorData(t *testing.T) {
	ticket := map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}},
		"required": []any{"id"}, "additionalProperties": false}
	for _, tc := range []struct {
		name   string
		schema any
		data   map[string]any
		want   string // the structured content
	}{
		{name: "no schema", data: map[string]any{"ticket": "T-9"}, want: `{"resourceId":"T-9","ticket":"T-9"}`},
		{name: "the tool's shape", schema: ticket, data: map[string]any{"id": "T-9"}, want: `{"id":"T-9"}`},
		{name: "another shape", schema: ticket, data: map[string]any{"ticket": "T-9"}, want: `{"resourceId":"T-9","ticket":"T-9"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := outputSchema(tc.schema)
			if err != nil {
				t.Fatal(err)
			}
			got := replayed(client.Result{Data: tc.data, ResourceID: "T-9"}, rs)
			if b, _ := json.Marshal(got.StructuredContent); string(b) != tc.want || !strings.Contains(errorTextOf(got), `"resourceId":"T-9"`) {
				t.Fatalf("replay = %s, %q; want %s", b, errorTextOf(got), tc.want)
			}
		})
	}
}

// TestFitted: an answer whose structured content fits the tool's output
// schema (formats asserted, as the official clients assert them), an
// error without structured content, and any answer of a tool without a
// schema stay as they are; an error loses structured content that does not
// fit; any other is answered as its text, an error that says the call
// succeeded. A
// schema the official clients could not compile either (a reference to
// another document, a file, or looping) is refused, and checks nothing:
// the tool is served without it.
func TestFitted(t *testing.T) {
	ticket := map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string"}},
		"required": []any{"id"}, "additionalProperties": false}
	text := func(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }
	for _, tc := range []struct {
		name   string
		schema any
		res    *mcp.CallToolResult
		why    string // fitted's reason; "" for an answer kept as it is
		says   string
	}{
		{name: "fits", schema: ticket, res: &mcp.CallToolResult{Content: text("T-1"), StructuredContent: map[string]any{"id": "T-1"}}},
		{name: "no schema", res: &mcp.CallToolResult{Content: text("T-1"), StructuredContent: map[string]any{"x": 1.0}}},
		{name: "an error", schema: ticket, res: &mcp.CallToolResult{IsError: true, Content: text("declined")}},
		{name: "an error with structured content that fits", schema: ticket, res: &mcp.CallToolResult{IsError: true, Content: text("declined"),
			StructuredContent: map[string]any{"id": "T-1"}}},
		{name: "an error with structured content of another shape", schema: ticket, res: &mcp.CallToolResult{IsError: true, Content: text("declined"),
			StructuredContent: map[string]any{"error": "declined"}}, why: "shape", says: "declined"},
		{name: "a member the schema has not", schema: ticket, res: &mcp.CallToolResult{Content: text(`{"id":"T-1","resourceId":"T-1"}`),
			StructuredContent: map[string]any{"id": "T-1", "resourceId": "T-1"}}, why: "shape", says: `{"id":"T-1","resourceId":"T-1"}`},
		{name: "a required member missing", schema: ticket, res: &mcp.CallToolResult{StructuredContent: map[string]any{"ticket": "T-1"}}, why: "shape", says: `{"ticket":"T-1"}`},
		{name: "no structured content", schema: ticket, res: &mcp.CallToolResult{Content: text("too large to keep")}, why: "missing", says: "too large to keep"},
		{name: "a format", schema: map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string", "format": "uuid"}}},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"id": "T-1"}}, why: "shape", says: `{"id":"T-1"}`},
		{name: "a format of its own", schema: map[string]any{"type": "object", "properties": map[string]any{"id": map[string]any{"type": "string", "format": "ticket-id"}}},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"id": "T-1"}}},
		{name: "refused: a reference that loops", schema: map[string]any{"$defs": map[string]any{"a": map[string]any{"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"x": 1.0}}},
		{name: "refused: a reference to another document", schema: map[string]any{"$ref": "https://elsewhere.example/s.json"},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"x": 1.0}}},
		{name: "refused: a reference to a local file", schema: map[string]any{"$ref": "file:///etc/hostname"},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"x": 1.0}}},
		{name: "refused: a pattern JavaScript cannot compile", schema: map[string]any{"properties": map[string]any{"id": map[string]any{"pattern": `^T\-\d+$`}}},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"id": "T-1"}}},
		{name: "refused: a pattern with a lookahead", schema: map[string]any{"properties": map[string]any{"id": map[string]any{"pattern": `^(?=T)`}}},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"id": "T-1"}}},
		{name: "a pattern matched as JavaScript matches it", schema: map[string]any{"properties": map[string]any{"id": map[string]any{"pattern": `^\S+$`}}},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"id": "T\u00a01"}}, why: "shape", says: `T`},
		{name: "refused: a draft-07 tuple, which the Python client refuses as a schema", schema: map[string]any{"properties": map[string]any{
			"p": map[string]any{"type": "array", "items": []any{map[string]any{"type": "string"}}}}},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"p": []any{"a"}}}},
		{name: "refused: 4097 objects", schema: map[string]any{"type": "object", "properties": manyProperties(4094)},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"x": 1.0}}},
		{name: "4096 objects", schema: map[string]any{"type": "object", "properties": manyProperties(4093)},
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"x": 1.0}}, why: "shape", says: `{"x":1}`},
		{name: "refused: branches that double at each of 30 levels", schema: anyOfChain(30),
			res: &mcp.CallToolResult{StructuredContent: map[string]any{"x": 1.0}}},
		{name: "a thread of 24 replies a union checks 2^24 times", schema: threadSchema(),
			res: &mcp.CallToolResult{Content: text("T-24"), StructuredContent: thread(24)}, why: "too_costly", says: "T-24"},
		{name: "a thread of 3 replies", schema: threadSchema(), res: &mcp.CallToolResult{StructuredContent: thread(3)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := outputSchema(tc.schema)
			if (err != nil) != strings.HasPrefix(tc.name, "refused:") {
				t.Fatalf("outputSchema: %v", err)
			}
			got, why := fitted(tc.res, rs)
			if kept := got == tc.res; why != tc.why || kept != (tc.why == "") {
				t.Fatalf("kept %v for %q, want %q: %+v", kept, why, tc.why, got)
			}
			succeeded := tc.res.IsError || strings.Contains(errorText(got), "ran and succeeded")
			if tc.why != "" && (!got.IsError || got.StructuredContent != nil || !succeeded || !strings.Contains(errorText(got), tc.says)) {
				t.Fatalf("answer %+v (%q), want an error without structured content saying %q, and that it succeeded unless it failed",
					got, errorText(got), tc.says)
			}
			if tc.res.IsError && tc.why != "" && errorText(got) != errorText(tc.res) {
				t.Fatalf("an error's text %q, want the tool's %q", errorText(got), errorText(tc.res))
			}
		})
	}
}

// manyProperties returns n+1 properties, each a schema of its own, one
// of them x.
func manyProperties(n int) map[string]any {
	props := map[string]any{}
	for i := range n {
		props[fmt.Sprint("p", i)] = map[string]any{"type": "string"}
	}
	props["x"] = map[string]any{"type": "string"}
	return props
}

func errorTextOf(r *mcp.CallToolResult) string { return errorText(r) }

func TestSelectParams(t *testing.T) {
	args := map[string]any{"amount": 5.0, "to": map[string]any{"iban": "X", "name": "Y"}, "memo": "m", "a/b": 1.0, "list": []any{"p", "q"}}
	for _, tc := range []struct {
		ptrs []string
		want string
	}{
		{nil, `{"a/b":1,"amount":5,"list":["p","q"],"memo":"m","to":{"iban":"X","name":"Y"}}`},
		{[]string{"/amount", "/to/iban"}, `{"/amount":5,"/to/iban":"X"}`},
		{[]string{"/missing", "/list/1", "/list/01", "/a~1b"}, `{"/a~1b":1,"/list/1":"q"}`},
	} {
		if got := jsonOf(selectParams(args, tc.ptrs)); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.ptrs, got, tc.want)
		}
	}
}

// FuzzArguments: no arguments a caller sends make the gateway's decoding,
// selection or fingerprinting panic.
func FuzzArguments(f *testing.F) {
	f.Add(`{"title": "x", "n": 1e400, "deep": {"a": [1, 2, {"b": null}]}}`, "/deep/a/2/b")
	f.Add(`[1]`, "/0")
	f.Add(`{"a": 9007199254740993}`, "/a")
	f.Fuzz(func(t *testing.T, raw, ptr string) {
		args, err := arguments(json.RawMessage(raw))
		if err != nil {
			return
		}
		_ = selectParams(args, []string{ptr})
		_ = pointString(args, ptr)
	})
}

// FuzzFitted: no output schema an upstream lists, and no result, make the
// check of an answer panic; an answer it keeps with structured content fits
// the schema, and one it does not keep is an error with no structured
// content that keeps the text.
func FuzzFitted(f *testing.F) {
	f.Add(`{"type":"object","properties":{"id":{"type":"string"}},"required":["id"],"additionalProperties":false}`, `{"id":"T-1"}`)
	f.Add(`{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, `{"x":[1,{"y":null}]}`)
	f.Add(`{"anyOf":[{"type":"array","items":{"type":"integer"}},{"pattern":"^a+$"}]}`, `[1,2.5]`)
	f.Add(`{"$schema":"https://json-schema.org/draft/2019-09/schema"}`, `"x"`)
	f.Add(`{"properties":{"at":{"format":"date-time"},"to":{"format":"email"},"n":{"format":"int32"}}}`, `{"at":"2024-06-30T23:59:60Z","to":"a@b.co","n":1}`)
	f.Add(`{"$dynamicAnchor":"n","properties":{"c":{"$dynamicRef":"#n"}},"$defs":{"b":{"$id":"urn:b","$dynamicAnchor":"n"}}}`, `{"c":{"c":{}}}`)
	f.Add(`{"$schema":"https://json-schema.org/draft/2019-09/schema","$recursiveAnchor":true,"items":{"$recursiveRef":"#"}}`, `[[1],[]]`)
	f.Fuzz(func(t *testing.T, schema, content string) {
		var s, c any
		if json.Unmarshal([]byte(schema), &s) != nil || json.Unmarshal([]byte(content), &c) != nil || c == nil {
			return
		}
		rs, err := outputSchema(s)
		if err != nil {
			return
		}
		for _, failed := range []bool{false, true} {
			res := &mcp.CallToolResult{IsError: failed, Content: []mcp.Content{&mcp.TextContent{Text: content}}, StructuredContent: c}
			got, _ := fitted(res, rs)
			switch {
			case got == res && rs != nil && rs.validate(c) != nil:
				t.Fatalf("kept an answer that does not fit: %s against %s", content, schema)
			case got != res && (!got.IsError || got.StructuredContent != nil || !strings.Contains(errorText(got), content)):
				t.Fatalf("the answer for %s: %+v", content, got)
			}
		}
	})
}

// FuzzRecord: what the gateway records of any answer is what the ledger
// takes: data with a canonical form within its size limit, and a resource
// id it accepts.
func FuzzRecord(f *testing.F) {
	f.Add(`{"content":[{"type":"text","text":"Opened T-1."}],"structuredContent":{"id":"T-1"}}`, "/id")
	f.Add(`{"content":[],"structuredContent":{"id":"T-1\n"}}`, "/id")
	f.Add(`{"content":[],"structuredContent":{"id":12345678901234567890}}`, "/id")
	f.Add(`{"_meta":{"a":{"a":{"a":1}}},"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}]}`, "")
	f.Fuzz(func(t *testing.T, result, ptr string) {
		var res mcp.CallToolResult
		if json.Unmarshal([]byte(result), &res) != nil || fingerprint.ValidatePointer(ptr) != nil {
			return
		}
		r := record(&res, ptr)
		if err := ledger.ValidateResourceID(r.ResourceID); err != nil {
			t.Fatalf("resource id %q: %v", r.ResourceID, err)
		}
		if b, err := fingerprint.Canonical(r.Data); err != nil || len(b) > ledger.MaxResultDataLen {
			t.Fatalf("data of %d bytes: %v", len(b), err)
		}
	})
}

// BenchmarkFitted: the check of a call's answer against a typed tool's
// output schema, which every answer of such a tool pays.
func BenchmarkFitted(b *testing.B) {
	rs, err := outputSchema(map[string]any{"type": "object", "additionalProperties": false, "required": []any{"id", "title"},
		"properties": map[string]any{"id": map[string]any{"type": "string"}, "title": map[string]any{"type": "string"}, "priority": map[string]any{"type": "integer"}}})
	if err != nil {
		b.Fatal(err)
	}
	res := &mcp.CallToolResult{StructuredContent: map[string]any{"id": "T-1", "title": "Printer on fire", "priority": 2.0}}
	for b.Loop() {
		if got, _ := fitted(res, rs); got != res {
			b.Fatal("not kept")
		}
	}
}

// TestFailed: a recorded failure is answered with the tool's text (its
// detail), else the message a reconciler gave, else words for its code;
// an operation out of attempts says it will not run again.
func TestFailed(t *testing.T) {
	for _, tc := range []struct {
		f    client.FailedError
		want string
	}{
		{client.FailedError{Code: "tool_error", Detail: "priority must be 1 to 5", Message: "m"}, "priority must be 1 to 5"},
		{client.FailedError{Code: "ABANDONED", Message: "the refund was cancelled by hand", Reason: "ABANDONED"}, "the refund was cancelled by hand"},
		{client.FailedError{Code: "CARD_DECLINED"}, "The tool failed (CARD_DECLINED)."},
		{client.FailedError{Code: "RETRIES_EXHAUSTED", Reason: "RETRIES_EXHAUSTED"}, "The operation ran out of attempts: it will not run again under this key."},
	} {
		res := failed(&tc.f)
		if !res.IsError || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != tc.want {
			t.Errorf("failed(%+v) = %+v, want an error saying %q", tc.f, res, tc.want)
		}
	}
}
