package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/httpapi"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// api is the HTTP/JSON API in front of a ledger service with API keys.
type api struct {
	url  string
	keys map[string]string // scope -> key
}

// starts numbers the stacks, so a test run again (-count) has a tenant
// of its own on the same Redis.
var starts atomic.Int64

func start(t testing.TB, rdb redis.UniversalClient) *api {
	t.Helper()
	tenant := fmt.Sprintf("http-%s-%d", strings.ToLower(t.Name()), starts.Add(1))
	st := servicetest.StartHTTP(t, rdb, servicetest.Options{Policy: ledgertest.Policy}, tenant, "k", nil)
	return &api{url: st.URL, keys: st.Keys}
}

// reply is an answer: its status and JSON body.
type reply struct {
	status int
	body   map[string]any
}

// reason is the ErrorInfo reason of an error body.
func (r reply) reason() string {
	details, _ := r.body["details"].([]any)
	for _, d := range details {
		if m, _ := d.(map[string]any); m["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" {
			s, _ := m["reason"].(string)
			return s
		}
	}
	return ""
}

func (r reply) get(path ...string) any {
	var v any = r.body
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	return v
}

func (a *api) call(t *testing.T, scope, method, path, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if scope != "" {
		req.Header.Set("Authorization", "Bearer "+a.keys[scope])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("%s %s: Cache-Control %q, X-Content-Type-Options %q; want no-store, nosniff", method, path,
			resp.Header.Get("Cache-Control"), resp.Header.Get("X-Content-Type-Options"))
	}
	for k := range resp.Header {
		if strings.HasPrefix(k, "Grpc-") {
			t.Errorf("%s %s: the gRPC header %s: %q", method, path, k, resp.Header.Get(k))
		}
	}
	r := reply{status: resp.StatusCode}
	if err := json.Unmarshal(b, &r.body); err != nil {
		t.Fatalf("%s %s: %d, not a JSON object: %q", method, path, resp.StatusCode, b)
	}
	return r
}

// TestEveryRPCOverHTTP: each RPC at its path, with the caller's API key;
// errors with the gRPC status as JSON, the ErrorInfo among its details,
// and the HTTP status of the code (409 for the conflicts); ids with ':'
// in the path, and with '/' through the body and query bindings.
func TestEveryRPCOverHTTP(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		a := start(t, rdb)
		reserve := `{"tool":"payments.refund","params":{"amount":5},"permit_id":"p-1","holder":"h-1"}`
		r := a.call(t, "agent", "POST", "/v1/operations/wf-1:refund:reserve", reserve)
		token, _ := r.get("operation", "fencingToken").(string)
		if r.status != 200 || r.get("decision") != "DECISION_EXECUTE" || r.get("operation", "operationId") != "wf-1:refund" || token == "" {
			t.Fatalf("Reserve = %+v", r)
		}
		if again := a.call(t, "agent", "POST", "/v1/operations/wf-1:refund:reserve", reserve); again.get("decision") != "DECISION_EXECUTE" ||
			again.get("operation", "fencingToken") != token {
			t.Fatalf("Reserve again (same holder) = %+v", again)
		}
		changed := a.call(t, "agent", "POST", "/v1/operations/wf-1:refund:reserve", strings.Replace(reserve, `"amount":5`, `"amount":6`, 1))
		if changed.status != http.StatusConflict || changed.reason() != "IDEMPOTENCY_KEY_REUSED" {
			t.Fatalf("a changed request = %+v, want 409 IDEMPOTENCY_KEY_REUSED", changed)
		}
		done := a.call(t, "agent", "POST", "/v1/operations/wf-1:refund:complete",
			`{"fencing_token":"`+token+`","outcome":"OUTCOME_SUCCEEDED","result":{"resource_id":"re_1","data":{"refund":"re_1"}}}`)
		if done.status != 200 || done.get("operation", "state") != "STATE_SUCCEEDED" {
			t.Fatalf("Complete = %+v", done)
		}
		look := a.call(t, "viewer", "GET", "/v1/operations/wf-1:refund", "")
		if look.status != 200 || look.get("operation", "result", "resourceId") != "re_1" {
			t.Fatalf("Lookup = %+v", look)
		}
		// A compensation names what it reverses; the Lookup of either shows
		// the link.
		undo := a.call(t, "agent", "POST", "/v1/operations/wf-1:undo:reserve", `{"tool":"payments.charge","holder":"h-3","compensates":"wf-1:refund"}`)
		if undo.status != 200 || undo.get("operation", "compensates") != "wf-1:refund" {
			t.Fatalf("Reserve of a compensation = %+v", undo)
		}
		if by, _ := a.call(t, "viewer", "GET", "/v1/operations/wf-1:refund", "").get("operation", "compensatedBy").([]any); len(by) != 1 || by[0] != "wf-1:undo" {
			t.Fatalf("compensatedBy = %v", by)
		}
		if me := a.call(t, "viewer", "GET", "/v1/caller", ""); me.get("principal") != "k-viewer" || fmt.Sprint(me.get("scopes")) != "[viewer]" {
			t.Fatalf("GetCaller = %+v", me)
		}

		// Errors made before the service is called (the body, the query,
		// the path) carry the ErrorInfo too, and name no value of the
		// request (secret stands for one). A path or method the API does
		// not have is UNIMPLEMENTED, never NOT_FOUND.
		const secret = "s3cr3t"
		for _, c := range []struct {
			name, scope, method, path, body string
			status, code                    int
			reason                          string
		}{
			{"no credentials", "", "GET", "/v1/operations/wf-1:refund", "", 401, 16, "UNAUTHENTICATED"},
			{"a viewer's Reserve", "viewer", "POST", "/v1/operations/x:reserve", reserve, 403, 7, "PERMISSION_DENIED"},
			{"no such operation", "viewer", "GET", "/v1/operations/never", "", 404, 5, "NOT_FOUND"},
			{"bad input", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"bad tool"}`, 400, 3, "INVALID_ARGUMENT"},
			{"a stale token", "agent", "POST", "/v1/operations/wf-1:refund:complete", `{"fencing_token":"1","outcome":"OUTCOME_SUCCEEDED"}`, 409, 9, "STALE_FENCING_TOKEN"},
			{"not JSON", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"s3cr3t`, 400, 3, "INVALID_ARGUMENT"},
			{"an unknown field", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"t.x","amount":5,"params":{"card":"s3cr3t"}}`, 400, 3, "INVALID_ARGUMENT"},
			{"a value of the wrong kind", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"t.x","params":{"card":"s3cr3t"},"holder":5}`, 400, 3, "INVALID_ARGUMENT"},
			{"a number JSON cannot hold", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"t.x","params":{"s3cr3t":1e999}}`, 400, 3, "INVALID_ARGUMENT"},
			{"two bodies", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"t.x"}{"tool":"s3cr3t"}`, 400, 3, "INVALID_ARGUMENT"},
			{"params a double would round", "agent", "POST", "/v1/operations/x:reserve", `{"tool":"t.x","params":{"s3cr3t":9007199254740993}}`, 400, 3, "INVALID_ARGUMENT"},
			{"result data a double would round", "agent", "POST", "/v1/operations/wf-1:refund:complete",
				`{"fencing_token":"1","outcome":"OUTCOME_SUCCEEDED","result":{"data":{"s3cr3t":[9007199254740993]}}}`, 400, 3, "INVALID_ARGUMENT"},
			{"another id in the body than the path's", "agent", "POST", "/v1/operations/x:reserve", `{"operation_id":"y","tool":"t.x"}`, 400, 3, "INVALID_ARGUMENT"},
			{"another run in the body than the path's", "agent", "POST", "/v1/runs/r-9:start", `{"run_id":"r-8"}`, 400, 3, "INVALID_ARGUMENT"},
			{"another id in the query than the path's", "viewer", "GET", "/v1/operations/wf-1:refund?operation_id=never", "", 400, 3, "INVALID_ARGUMENT"},
			{"another run in the query than the path's, by JSON name", "viewer", "GET", "/v1/runs/never?runId=r-1", "", 400, 3, "INVALID_ARGUMENT"},
			{"a path not UTF-8", "viewer", "GET", "/v1/operations/%FF", "", 400, 3, "INVALID_ARGUMENT"},
			{"a query not UTF-8", "viewer", "GET", "/v1/operations:lookup?operation_id=%FF", "", 400, 3, "INVALID_ARGUMENT"},
			{"a misspelt filter", "reconciler", "GET", "/v1/operations:unresolved?state=STATE_UNKNOWN", "", 400, 3, "INVALID_ARGUMENT"},
			{"a filter's value", "reconciler", "GET", "/v1/operations:unresolved?page_size=s3cr3t", "", 400, 3, "INVALID_ARGUMENT"},
			{"a query the path does not read", "viewer", "GET", "/v1/operations/wf-1:refund?at=s3cr3t", "", 400, 3, "INVALID_ARGUMENT"},
			{"a query of a request that has no fields", "viewer", "GET", "/v1/caller?tenant=s3cr3t", "", 400, 3, "INVALID_ARGUMENT"},
			{"a query beside a body", "agent", "POST", "/v1/operations/x:reserve?tool=s3cr3t", reserve, 400, 3, "INVALID_ARGUMENT"},
			{"no such path", "viewer", "GET", "/v1/operation/wf-1:refund", "", 404, 12, ""},
			{"a path outside /v1/", "viewer", "GET", "/nothing", "", 404, 12, ""},
			{"a path that leaves /v1/ (redirected to /)", "viewer", "DELETE", "/v1/..", "", 404, 12, ""},
			{"another method", "viewer", "DELETE", "/v1/operations/wf-1:refund", "", 405, 12, ""},
			{"a browser's CORS preflight", "", "OPTIONS", "/v1/operations:reserve", "", 405, 12, ""},
			{"no such run", "viewer", "GET", "/v1/runs/never", "", 404, 5, "NOT_FOUND"},
			{"a compensation of what did not succeed", "agent", "POST", "/v1/operations/y:reserve", `{"tool":"t.x","compensates":"never"}`, 409, 9, "NOT_COMPENSABLE"},
		} {
			r := a.call(t, c.scope, c.method, c.path, c.body)
			if r.status != c.status || r.get("code") != float64(c.code) || r.reason() != c.reason {
				t.Errorf("%s: %d, code %v, %q (%v), want %d, code %d, %q", c.name, r.status, r.get("code"), r.reason(), r.body, c.status, c.code, c.reason)
			}
			if msg, _ := r.get("message").(string); strings.Contains(fmt.Sprint(r.body), secret) || msg == "" {
				t.Errorf("%s: the answer repeats a value of the request, or has no message: %v", c.name, r.body)
			}
		}

		// The path's id may be repeated in the query.
		if same := a.call(t, "viewer", "GET", "/v1/operations/wf-1:refund?operationId=wf-1%3Arefund", ""); same.status != 200 {
			t.Fatalf("Lookup with the path's id in the query = %+v", same)
		}
		// The path's id may be repeated in the body.
		if same := a.call(t, "agent", "POST", "/v1/operations/wf-2:reserve", `{"operation_id":"wf-2","tool":"t.x","holder":"h-9"}`); same.status != 200 ||
			same.get("operation", "operationId") != "wf-2" {
			t.Fatalf("Reserve with the path's id in the body = %+v", same)
		}
		// An id with '/' cannot be a path segment: the body and query
		// bindings name it.
		slash := a.call(t, "agent", "POST", "/v1/operations:reserve", `{"operation_id":"acme/eu:1","tool":"t.x","holder":"h-2"}`)
		if slash.status != 200 || slash.get("operation", "operationId") != "acme/eu:1" {
			t.Fatalf("Reserve by body = %+v", slash)
		}
		if got := a.call(t, "viewer", "GET", "/v1/operations:lookup?operation_id=acme%2Feu%3A1", ""); got.get("operation", "operationId") != "acme/eu:1" {
			t.Fatalf("Lookup by query = %+v", got)
		}

		list := a.call(t, "reconciler", "GET", "/v1/operations:unresolved?states=STATE_RUNNING&page_size=10", "")
		if list.status != 200 {
			t.Fatalf("ListUnresolved = %+v", list)
		}
		run := a.call(t, "agent", "POST", "/v1/runs/r-1:start", `{"limits":{"max_steps":1,"deadline":"60s"}}`)
		if run.status != 200 || run.get("run", "state") != "RUN_STATE_RUNNING" || run.get("run", "limits", "deadline") != "60s" {
			t.Fatalf("StartRun = %+v", run)
		}
		step := func(id string) reply {
			return a.call(t, "agent", "POST", "/v1/operations/"+id+":reserve", `{"tool":"t.x","holder":"h-`+id+`","run_id":"r-1"}`)
		}
		if s := step("s-1"); s.status != 200 {
			t.Fatalf("a step = %+v", s)
		}
		if s := step("s-2"); s.status != http.StatusConflict || s.reason() != "RUN_STEP_LIMIT" {
			t.Fatalf("a step past the cap = %+v, want 409 RUN_STEP_LIMIT", s)
		}
		if got := a.call(t, "viewer", "GET", "/v1/runs/r-1", ""); got.get("run", "state") != "RUN_STATE_STEP_LIMIT" {
			t.Fatalf("GetRun = %+v", got)
		}
		if got := a.call(t, "viewer", "GET", "/v1/runs", ""); got.status != 200 || len(got.body["runs"].([]any)) != 1 {
			t.Fatalf("ListRuns = %+v", got)
		}
		for q, n := range map[string]int{"states=RUN_STATE_STEP_LIMIT": 1, "states=RUN_STATE_RUNNING&states=RUN_STATE_DONE": 0} {
			got := a.call(t, "viewer", "GET", "/v1/runs?"+q, "")
			if runs, _ := got.body["runs"].([]any); got.status != 200 || len(runs) != n {
				t.Errorf("ListRuns ?%s = %+v, want %d runs", q, got, n)
			}
		}
		if got := a.call(t, "viewer", "GET", "/v1/runs?states=RUN_STATE_UNSPECIFIED", ""); got.status != 400 || got.reason() != "INVALID_ARGUMENT" {
			t.Errorf("ListRuns of no state = %+v, want 400 INVALID_ARGUMENT", got)
		}
	})
}

// FuzzHandler: whatever the method, path, query and body, the API answers
// JSON, never INTERNAL or another server error, and every error but a path
// or method it does not have (UNIMPLEMENTED) carries an ErrorInfo; a 405
// names the methods the path takes, the request's not among them.
func FuzzHandler(f *testing.F) {
	for _, seed := range []struct {
		method uint8
		target string
		body   []byte
	}{
		{1, "operations/wf-1:reserve", []byte(`{"tool":"t.x","params":{"amount":5},"holder":"h-1"}`)},
		{1, "operations/wf-1:complete", []byte(`{"fencing_token":"1","outcome":"OUTCOME_SUCCEEDED","result":{"data":{"a":1}}}`)},
		{1, "operations:reserve", []byte(`{"operation_id":"a/b","tool":"t.x"}`)},
		{0, "operations/wf-1", nil},
		{0, "operations:lookup?operation_id=%FF", nil},
		{0, "operations:unresolved?states=STATE_UNKNOWN&page_size=2&tool=t.x", nil},
		{0, "runs?states=RUN_STATE_RUNNING&page_token=zz", nil},
		{1, "runs/r-1:start", []byte(`{"limits":{"max_steps":1,"deadline":"60s"}}`)},
		{2, "operations/%E2%9C%93", nil},
		{1, "operations/x:reserve", []byte("{\"tool\":\"t\xff\"}")},
		{2, "..", []byte("0")},
	} {
		f.Add(seed.method, seed.target, seed.body)
	}
	a := start(f, redistest.Embedded(f))
	methods := []string{"GET", "POST", "DELETE", "PUT", "PATCH"}
	f.Fuzz(func(t *testing.T, method uint8, target string, body []byte) {
		req, err := http.NewRequest(methods[int(method)%len(methods)], a.url+"/v1/"+target, strings.NewReader(string(body)))
		if err != nil {
			return // not a request a client can send
		}
		req.Header.Set("Authorization", "Bearer "+a.keys["agent"])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return // refused by net/http before any handler
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		r := reply{status: resp.StatusCode}
		if err := json.Unmarshal(b, &r.body); err != nil {
			if resp.StatusCode == http.StatusBadRequest && !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				return // net/http's own refusal of a malformed request line
			}
			t.Fatalf("%s /v1/%q: %d, not JSON: %q", req.Method, target, resp.StatusCode, b)
		}
		code, _ := r.get("code").(float64)
		switch {
		case resp.StatusCode >= 500:
			t.Fatalf("%s /v1/%q: %d %v", req.Method, target, resp.StatusCode, r.body)
		case resp.StatusCode != 200 && code != 12 && r.reason() == "":
			t.Fatalf("%s /v1/%q: %d without an ErrorInfo: %v", req.Method, target, resp.StatusCode, r.body)
		case resp.StatusCode == http.StatusMethodNotAllowed && (resp.Header.Get("Allow") == "" || strings.Contains(resp.Header.Get("Allow"), req.Method)):
			t.Fatalf("%s /v1/%q: 405 with Allow %q", req.Method, target, resp.Header.Get("Allow"))
		}
	})
}

// TestOpenAPI: the description is served, and names every path the
// gateway serves.
func TestOpenAPI(t *testing.T) {
	a := start(t, redistest.Embedded(t))
	resp, err := http.Get(a.url + httpapi.OpenAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Swagger string                    `json:"swagger"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: %d %q, %v", httpapi.OpenAPIPath, resp.StatusCode, resp.Header.Get("Content-Type"), err)
	}
	for _, p := range []string{"/v1/operations/{operationId}:reserve", "/v1/operations/{operationId}", "/v1/operations:unresolved",
		"/v1/operations:reserve", "/v1/runs/{runId}:start", "/v1/runs"} {
		if doc.Paths[p] == nil {
			t.Errorf("the OpenAPI description has no path %s (it has %d)", p, len(doc.Paths))
		}
	}
	if doc.Swagger != "2.0" {
		t.Errorf("swagger %q, want 2.0", doc.Swagger)
	}
}
