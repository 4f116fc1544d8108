package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
)

// TestClassify: only a refused connection, a JSON-RPC refusal of the
// request or an HTTP status that says the request was not processed
// proves the tool did not run.
func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int // of the call's POST
		want   client.Class
	}{
		{fmt.Errorf("calling: %w", &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), 0, client.Retryable},
		{&jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "unknown tool"}, 0, client.Retryable},
		{fmt.Errorf("x: %w", &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound}), 0, client.Retryable},
		{&jsonrpc.Error{Code: jsonrpc.CodeInternalError}, 0, client.Ambiguous},
		{fmt.Errorf("x: %w", mcp.ErrConnectionClosed), 0, client.Ambiguous},
		{fmt.Errorf("sending: %w", mcp.ErrSessionMissing), 0, client.Retryable},
		{context.DeadlineExceeded, 0, client.Ambiguous},
		{errors.New("EOF"), 0, client.Ambiguous},
		{errors.New(`sending "tools/call": Too Many Requests`), http.StatusTooManyRequests, client.Retryable},
		{errors.New(`sending "tools/call": Unauthorized`), http.StatusUnauthorized, client.Retryable},
		{errors.New(`sending "tools/call": Bad Request`), http.StatusBadRequest, client.Retryable},
		{errors.New(`sending "tools/call": Bad Gateway`), http.StatusBadGateway, client.Ambiguous},
		{errors.New(`sending "tools/call": Service Unavailable`), http.StatusServiceUnavailable, client.Ambiguous},
		{errors.New(`sending "tools/call": Conflict`), http.StatusConflict, client.Ambiguous},
		{errors.New("EOF"), http.StatusOK, client.Ambiguous}, // the answer's stream broke off
	} {
		if got := client.ClassOf(classify(tc.err, tc.status)); got != tc.want {
			t.Errorf("%v (HTTP %d): %v, want %v", tc.err, tc.status, got, tc.want)
		}
	}
}

// TestEnvironment: a command gets the gateway's environment without the
// variables of ledger keys, and its configured env on top.
func TestEnvironment(t *testing.T) {
	t.Setenv("GW_KEY", "gw.secret")
	t.Setenv("ACME_KEY", "acme.secret")
	t.Setenv("KEEP", "1")
	t.Setenv("OVERRIDE", "old")
	g := &Gateway{cfg: &Config{Ledger: LedgerConfig{APIKeyEnv: "GW_KEY"}, Reconcile: ReconcileConfig{APIKeyEnvs: []string{"ACME_KEY"}}}}
	u := &upstream{g: g, cfg: UpstreamConfig{Env: map[string]string{"OVERRIDE": "new", "TOKEN": "t"}}}
	env := u.environment()
	for _, want := range []string{"KEEP=1", "OVERRIDE=new", "TOKEN=t"} {
		if !slices.Contains(env, want) {
			t.Errorf("no %s in the command's environment", want)
		}
	}
	for _, kv := range env {
		if strings.Contains(kv, "secret") || kv == "OVERRIDE=old" {
			t.Errorf("%s in the command's environment", kv)
		}
	}
}

// TestHeaders: an HTTP upstream gets the configured headers with every
// request.
func TestHeaders(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	c := &http.Client{Transport: headers{h: map[string]string{"Authorization": "Bearer t"}, next: http.DefaultTransport}}
	for range 2 {
		resp, err := c.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if !slices.Equal(got, []string{"Bearer t", "Bearer t"}) {
		t.Fatalf("the upstream got %q", got)
	}
}

// TestAnswersBounded: a URL upstream's answer reads whole up to
// maxMessage and fails past it, unless it is an event stream, which
// go-sdk bounds per event, or a JSON answer to a request with an id,
// which then reads as a JSON-RPC error to that request alone.
func TestAnswersBounded(t *testing.T) {
	const call = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{}}`
	for _, tc := range []struct {
		contentType string
		size        int
		request     string // the POST's body
		fails       bool
		answered    string // what the answer then reads as
	}{
		{"application/json", maxMessage, "{}", false, ""},
		{"application/json", maxMessage + 1, "{}", true, ""},
		{"application/json; charset=utf-8", maxMessage + 1, "{}", true, ""},
		{"text/plain", maxMessage + 1, "{}", true, ""},
		{"", maxMessage + 1, "{}", true, ""},
		{"text/event-stream", maxMessage + 1, "{}", false, ""},
		{"application/json", maxMessage, call, false, ""},
		{"application/json", maxMessage + 1, call, false, `{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"the answer exceeded 16777216 bytes"}}`},
		{"text/plain", maxMessage + 1, call, true, ""},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", tc.contentType)
			_, _ = w.Write(make([]byte, tc.size))
		}))
		c := &http.Client{Transport: headers{next: http.DefaultTransport}}
		resp, err := c.Post(srv.URL, "application/json", strings.NewReader(tc.request))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		srv.Close()
		fails := errors.Is(err, errTooLarge)
		switch {
		case fails != tc.fails || err != nil && !fails:
			t.Errorf("%q, %d bytes, request %s: read %d, %v; want it to fail %v", tc.contentType, tc.size, tc.request, len(body), err, tc.fails)
		case tc.answered != "" && string(body) != tc.answered:
			t.Errorf("%q, %d bytes, request %s: read %.200q, want %s", tc.contentType, tc.size, tc.request, body, tc.answered)
		case tc.answered == "" && !fails && len(body) != tc.size:
			t.Errorf("%q, %d bytes, request %s: read %d bytes, want them all", tc.contentType, tc.size, tc.request, len(body))
		}
	}
}

// TestCutURLs: each URL in an error's text is cut to its scheme and
// host; the error still unwraps to what it was.
func TestCutURLs(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`Post "https://mcp.example/s/k3y/mcp?key=k3y": dial tcp: connection refused`, `Post "https://mcp.example/…": dial tcp: connection refused`},
		{`Get "http://user:xxxxx@10.0.0.1:8080/mcp": EOF`, `Get "http://10.0.0.1:8080/…": EOF`},
		{`redirect to http://h?k=1 from https://h/a#b`, `redirect to http://h/… from https://h/…`},
		{`Post "https://mcp.example": EOF`, `Post "https://mcp.example": EOF`},
		{"ends with https://h/x", "ends with https://h/…"},
		{"no URL here: http:/ nor https:", "no URL here: http:/ nor https:"},
	} {
		if got := cutURLs(tc.in); got != tc.want {
			t.Errorf("cutURLs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if err := hideURLs(syscall.ECONNREFUSED); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("hideURLs(%v) does not unwrap to it", err)
	}
}

// FuzzCutURLs: whatever an error says, each URL left in it is a scheme
// and a host, and cutting again changes nothing.
func FuzzCutURLs(f *testing.F) {
	for _, s := range []string{`Post "https://h/s/k?x=1": EOF`, "http://", "https://a@b/c http://d?e", "http://h/…"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := cutURLs(s)
		if again := cutURLs(out); again != out {
			t.Fatalf("%q: cut to %q, then to %q", s, out, again)
		}
		for _, field := range strings.FieldsFunc(out, func(r rune) bool { return strings.ContainsRune("\"' \t\r\n", r) }) {
			for _, scheme := range []string{"http://", "https://"} {
				if _, rest, ok := strings.Cut(field, scheme); ok && strings.ContainsAny(strings.TrimSuffix(rest, "/…"), "/?#@") {
					t.Fatalf("%q: cut to %q, which keeps %q", s, out, field)
				}
			}
		}
	})
}
