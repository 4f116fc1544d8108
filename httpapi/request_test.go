package httpapi

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// secret stands for a parameter's value: no error may repeat it.
const secret = "s3cr3t"

// TestDecoderErrors: a body that is not one valid JSON request is refused
// with the place and kind of the problem, never a value of the body.
func TestDecoderErrors(t *testing.T) {
	onPath := map[string]string{"operation_id": "wf-1"}
	for _, c := range []struct {
		name, body, want string
		path             map[string]string // the request path's parameters
	}{
		{"a valid body", `{"tool":"t","params":{"card":"s3cr3t"}}`, "", nil},
		{"an empty body", ``, "EOF", nil},
		{"white space only", "  \n", "EOF", nil},
		{"an unknown field", `{"tool":"t","params":{"card":"s3cr3t"},"bogus":1}`,
			`invalid request: body: unknown field "bogus" (line 1, column 40)`, nil},
		{"a field twice", `{"tool":"t","tool":"s3cr3t"}`, `invalid request: body: duplicate field "tool" (line 1, column 13)`, nil},
		{"a value of the wrong kind", `{"tool":5,"params":{"card":"s3cr3t"}}`,
			`invalid request: body: not a valid value for field "tool" (line 1, column 9)`, nil},
		{"a number out of range", `{"tool":"t","params":{"s3cr3t":1e400}}`,
			`invalid request: body: not a valid ledger.v1.ReserveRequest (line 1, column 32)`, nil},
		{"a string not UTF-8", "{\"tool\":\"t\",\"params\":{\"card\":\"s3cr3t\xff\"}}",
			`invalid request: body: a string not UTF-8 (line 1, column 30)`, nil},
		{"not JSON", `s3cr3t`, `invalid request: body: not JSON (at byte 1)`, nil},
		{"cut short", `{"tool":"s3cr3t`, `invalid request: body: not JSON (it ends early)`, nil},
		{"two values", `{"tool":"t"} {"tool":"s3cr3t"}`, `invalid request: body: more than one JSON value`, nil},
		{"a value and more", `{"tool":"t"} s3cr3t`, `invalid request: body: more than one JSON value`, nil},
		{"the path's id again", `{"operation_id":"wf-1","tool":"t"}`, "", onPath},
		{"no id, with one on the path", `{"tool":"t"}`, "", onPath},
		{"another id than the path's", `{"operation_id":"wf-2","tool":"t"}`,
			`invalid request: operation_id: the body's "wf-2" differs from the path's "wf-1"`, onPath},
		{"an id, no path", `{"operation_id":"wf-2","tool":"t"}`, "", nil},
		{"an integer a double rounds", `{"tool":"t","params":{"id":9007199254740993}}`,
			`invalid request: params: a number no double carries exactly (an integer beyond 2^53); send it as a string`, nil},
		{"one deep in a list", `{"tool":"t","params":{"a":{"b":[1,-123456789012345678901234]}}}`,
			`invalid request: params: a number no double carries exactly (an integer beyond 2^53); send it as a string`, nil},
		{"numbers a double carries as written", `{"tool":"t","params":{"a":9007199254740992,"b":100000000000000000000,"c":1.5e300,"d":0.1}}`, "", nil},
		{"a number outside params", `{"tool":"t","step":7,"params":{}}`, "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			var req ledgerv1.ReserveRequest
			var body io.Reader = strings.NewReader(c.body)
			if c.path != nil {
				body = pathBody{io.NopCloser(body), c.path}
			}
			err := (&marshaler{}).NewDecoder(body).Decode(&req)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != c.want {
				t.Errorf("Decode(%q) = %q, want %q", c.body, got, c.want)
			}
			if c.want == "EOF" && !errors.Is(err, io.EOF) {
				t.Errorf("Decode(%q) = %v, want io.EOF itself (an empty body)", c.body, err)
			}
			if strings.Contains(got, secret) {
				t.Errorf("the error repeats a value of the body: %q", got)
			}
		})
	}
}

// TestDecoderTooLarge: a body cut by http.MaxBytesReader says so.
func TestDecoderTooLarge(t *testing.T) {
	body := http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(`{"tool":"`+strings.Repeat("x", 100)+`"}`)), 64)
	var req ledgerv1.ReserveRequest
	err := (&marshaler{}).NewDecoder(body).Decode(&req)
	if want := "invalid request: body: larger than 64 bytes"; err == nil || err.Error() != want {
		t.Errorf("Decode = %v, want %q", err, want)
	}
}

// TestKnownQuery: a query parameter the route does not read is refused by
// name: on a route whose request is its body any but the path's id, on
// another any that names no field of the request.
func TestKnownQuery(t *testing.T) {
	rt, err := newRoutes()
	if err != nil {
		t.Fatal(err)
	}
	op := map[string]string{"operation_id": "wf-1"}
	run := map[string]string{"run_id": "r-1"}
	const body = " (this path's request is its body)"
	for _, c := range []struct {
		method, path, query string
		params              map[string]string
		want                string
	}{
		{"GET", "/v1/operations:unresolved", "states=STATE_UNKNOWN&tool=t&page_size=5&overdue=true", nil, ""},
		{"GET", "/v1/operations:unresolved", "pageSize=5&pageToken=abc&needsReview=true", nil, ""},
		{"GET", "/v1/operations:unresolved", "state=STATE_UNKNOWN", nil, "invalid request: state: no such query parameter"},
		{"GET", "/v1/operations:unresolved", "tool=t&Tool=t", nil, "invalid request: Tool: no such query parameter"},
		{"GET", "/v1/operations:unresolved", "tool.name=t", nil, "invalid request: tool.name: no such query parameter"},
		{"GET", "/v1/operations/wf-1", "operation_id=wf-1&operationId=wf-1", op, ""},
		{"GET", "/v1/operations/wf-1", "operationid=wf-2", op, "invalid request: operationid: no such query parameter"},
		{"GET", "/v1/operations/wf-1", "page_size=5", op, "invalid request: page_size: no such query parameter"},
		{"GET", "/v1/operations:lookup", "operation_id=wf-1", nil, ""},
		{"GET", "/v1/operations:lookup", "operation_id=wf-1&x=1", nil, "invalid request: x: no such query parameter"},
		{"GET", "/v1/runs/r-1", "states=RUN_STATE_DONE", run, "invalid request: states: no such query parameter"},
		{"GET", "/v1/runs", "states=RUN_STATE_DONE&page_size=2", nil, ""},
		{"GET", "/v1/caller", "tenant=acme", nil, "invalid request: tenant: no such query parameter"},
		{"POST", "/v1/operations/wf-1:reserve", "operation_id=wf-1&operationId=wf-1", op, ""},
		{"POST", "/v1/operations/wf-1:reserve", "tool=t", op, "invalid request: tool: no such query parameter" + body},
		{"POST", "/v1/operations:reserve", "operation_id=wf-1", nil, "invalid request: operation_id: no such query parameter" + body},
		{"POST", "/v1/runs/r-1:end", "runId=r-1", run, ""},
		{"POST", "/v1/runs/r-1:end", "reason=done", run, "invalid request: reason: no such query parameter" + body},
	} {
		q, err := url.ParseQuery(c.query)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(c.method, c.path+"?"+c.query, nil)
		found := rt.find(r, c.method)
		if found.request == nil {
			t.Fatalf("%s %s: no route", c.method, c.path)
		}
		got := ""
		if err := knownQuery(q, c.params, found); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s %s?%s: %q, want %q", c.method, c.path, c.query, got, c.want)
		}
	}
}

// TestQueryParser: a value of the wrong kind is refused by the parameter's
// name only.
func TestQueryParser(t *testing.T) {
	for _, c := range []struct {
		query, want string
	}{
		{"states=STATE_UNKNOWN&tool=t&page_size=5&overdue=true", ""},
		{"pageSize=5&pageToken=abc&needsReview=true", ""},
		{"page_size=s3cr3t", "invalid request: page_size: not a valid value"},
		{"states=STATE_UNKNOWN&states=s3cr3t", "invalid request: states: not a valid value"},
		{"overdue=s3cr3t&tool=t", "invalid request: overdue: not a valid value"},
		{"tool=a&tool=b", "invalid request: tool: not a valid value"},
	} {
		values, err := url.ParseQuery(c.query)
		if err != nil {
			t.Fatal(err)
		}
		var req ledgerv1.ListUnresolvedRequest
		got := ""
		if err := (&queryParser{}).Parse(&req, values, utilities.NewDoubleArray(nil)); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("?%s: %q, want %q", c.query, got, c.want)
		}
	}
}

// TestUTF8Query: a path or query that is not UTF-8, decoded, is refused
// by the part that is not.
func TestUTF8Query(t *testing.T) {
	for _, c := range []struct {
		url, want string
	}{
		{"/v1/operations/wf-1:refund?x=%C3%A9", ""},
		{"/v1/operations/%E2%9C%93", ""},
		{"/v1/operations/%FF", "invalid request: path: not UTF-8"},
		{"/v1/operations:lookup?operation_id=a%FFb", "invalid request: operation_id: not UTF-8"},
		{"/v1/operations:lookup?%FF=a", "invalid request: query: a parameter's name is not UTF-8"},
		{"/v1/operations:lookup?operation_id=%ZZ", "invalid request: query: not a valid query string"},
	} {
		u, err := url.ParseRequestURI(c.url)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if _, err := utf8Query(u); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.url, got, c.want)
		}
	}
}

// TestOtherInQuery: a query may repeat a path parameter, by its proto or
// JSON name, but not name another value for it.
func TestOtherInQuery(t *testing.T) {
	path := map[string]string{"operation_id": "wf-1", "run_id": "r-1"}
	for _, c := range []struct {
		query, want string
	}{
		{"", ""},
		{"operation_id=wf-1&runId=r-1&page_size=5", ""},
		{"operation_id=wf-2", `invalid request: operation_id: the query's "wf-2" differs from the path's "wf-1"`},
		{"operationId=wf-1&operationId=wf-2", `invalid request: operation_id: the query's "wf-2" differs from the path's "wf-1"`},
		{"runId=r-2", `invalid request: run_id: the query's "r-2" differs from the path's "r-1"`},
		{"operationid=wf-2", ""}, // no such name: knownQuery refuses it
	} {
		q, err := url.ParseQuery(c.query)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if err := otherInQuery(q, path); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("?%s: %q, want %q", c.query, got, c.want)
		}
	}
	if got := jsonName("needs_review"); got != "needsReview" {
		t.Errorf("jsonName(needs_review) = %q", got)
	}
}
