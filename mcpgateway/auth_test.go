package mcpgateway_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/mcpgateway"
)

// TestTenantsAreIsolated (S8 through the gateway): two tenants call one
// gateway over Streamable HTTP with their own API keys. Each is its own
// tenant: the same operation id runs once per tenant and replays within
// it, and neither sees the other's record. A request without a key, or
// with one the ledger does not take, is refused; stdio callers act under
// the gateway's own key.
func TestTenantsAreIsolated(t *testing.T) {
	creds, keys := apiKeys(t, "reconciler", "acme", "globex", "initech")
	r := newRig(t, rigOptions{creds: creds, apiKeyEnv: "GW_KEY", env: map[string]string{"GW_KEY": keys["initech"]}})
	k := key(t, "shared-id")
	meta := mcp.Meta{mcpgateway.MetaIdempotencyKey: k}
	tickets := map[string]string{}
	for _, tenant := range []string{"acme", "globex", "acme", "globex"} {
		a := call(t, r.http(keys[tenant], clientOptions{}), "tickets_create_ticket", ticketArgs, meta)
		if a.isError {
			t.Fatalf("%s: %v", tenant, a)
		}
		if prev, ok := tickets[tenant]; ok && (a.ticket != prev || a.outcome() != "replayed") {
			t.Fatalf("%s's repeat = %v, want the replay of %s", tenant, a, prev)
		}
		tickets[tenant] = a.ticket
	}
	if tickets["acme"] == tickets["globex"] || r.up.Count("create_ticket") != 2 {
		t.Fatalf("tickets %v, %d effects: want one per tenant", tickets, r.up.Count("create_ticket"))
	}
	for tenant, ticket := range tickets {
		o, err := r.ledgerClient(keys[tenant]).Lookup(context.Background(), k)
		if err != nil || o.Result == nil || !strings.Contains(jsonString(o.Result.Data), ticket) {
			t.Errorf("%s's record = %+v, %v; want its own ticket %s", tenant, o, err, ticket)
		}
	}
	if _, err := r.ledgerClient(keys["initech"]).Lookup(context.Background(), k); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a third tenant's lookup = %v, want NOT_FOUND", err)
	}

	for name, bad := range map[string]string{"no key": "", "unknown key": "acme-agent.notthesecret", "not a key": "garbage"} {
		if _, err := r.dialHTTP(bad, clientOptions{}); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			t.Errorf("%s: connect = %v, want 401 Unauthorized", name, err)
		}
	}

	// A session belongs to the key that opened it.
	swap := &swappable{key: keys["acme"]}
	cs, err := newClient(clientOptions{}).Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: r.url, HTTPClient: &http.Client{Transport: swap}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	swap.set(keys["globex"])
	if _, err := callErr(cs, "tickets_search_tickets", nil, nil); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("acme's session with globex's key = %v, want 403 Forbidden", err)
	}

	a := call(t, r.stdio(clientOptions{}), "tickets_create_ticket", ticketArgs, meta)
	if a.isError || a.outcome() != "executed" || r.up.Count("create_ticket") != 3 {
		t.Fatalf("a stdio call under the gateway's key = %v, want a third tenant's effect", a)
	}
	if _, err := r.ledgerClient(keys["initech"]).Lookup(context.Background(), k); err != nil {
		t.Fatalf("the gateway's tenant has no record: %v", err)
	}
}

// swappable sends whichever key it was last set to.
type swappable struct {
	mu  sync.Mutex
	key string
}

func (s *swappable) set(k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = k
}

func (s *swappable) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	k := s.key
	s.mu.Unlock()
	return bearer{key: k, next: http.DefaultTransport}.RoundTrip(r)
}

// TestKeyNotChecked: while the ledger cannot be reached, a request with a
// key is answered 503 with Retry-After: the key may well be good, so not
// 401, and nothing is wrong with the gateway, so not go-sdk's 500.
func TestKeyNotChecked(t *testing.T) {
	r := newRig(t, rigOptions{ledgerAddr: ledgertest.ClosedAddr(t)})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"agent","version":"1"}}}`
	req, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(initialize))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer acme-agent.secret")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "could not check the key") {
		t.Fatalf("a key while the ledger is down = %d (Retry-After %q) %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// TestCheckKeys: a key of the gateway's own that the ledger refuses, or
// that lacks the scope its use needs, is an error at start that names the
// field and the variable (never the key); a ledger that does not answer is
// a warning, and a key nothing acts under (HTTP callers bring their own)
// is not asked about. One only background reconciliation of probed tools
// acts under is a warning when it is refused or lacks the reconciler
// scope.
func TestCheckKeys(t *testing.T) {
	keys, creds := servicetest.Keys(t, "acme", "acme")
	secured := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{Credentials: creds}).Addr
	open := servicetest.Start(t, redistest.Shared(t).Client(t), servicetest.Options{}).Addr
	env := map[string]string{"AGENT": keys["agent"], "RECONCILER": keys["reconciler"], "VIEWER": keys["viewer"], "MADE_UP": "acme-agent.made-up"}
	const stdio, overHTTP = "", "http: {listen: \"127.0.0.1:0\"}\n"
	for _, tc := range []struct {
		name, ledger, yaml, want, logs string
		probe                          bool // a tool rule has a probe
	}{
		{name: "stdio, an agent key", yaml: stdio + "ledger: {api_key_env: AGENT}"},
		{name: "stdio, a reconciler key", yaml: stdio + "ledger: {api_key_env: RECONCILER}"},
		{name: "stdio, a viewer key", yaml: stdio + "ledger: {api_key_env: VIEWER}",
			want: "ledger.api_key_env: the key in VIEWER has scopes [viewer]; it needs agent or reconciler"},
		{name: "stdio, a key the ledger refuses", yaml: stdio + "ledger: {api_key_env: MADE_UP}",
			want: "ledger.api_key_env: the ledger refuses the key in MADE_UP"},
		{name: "stdio, no key", yaml: stdio, want: "ledger.api_key_env is not set, and the ledger asks for an API key"},
		{name: "stdio, no key, a ledger without credentials", ledger: open, yaml: stdio},
		{name: "anonymous HTTP, a viewer key", yaml: "http: {listen: \"127.0.0.1:0\", anonymous: true}\nledger: {api_key_env: VIEWER}",
			want: "it needs agent or reconciler"},
		{name: "HTTP, no key", yaml: overHTTP},
		{name: "HTTP, a viewer key", yaml: overHTTP + "ledger: {api_key_env: VIEWER}"},
		{name: "HTTP, a key nothing acts under, that the ledger refuses", yaml: overHTTP + "ledger: {api_key_env: MADE_UP}"},
		{name: "a probe, reconciling under a key the ledger refuses", yaml: overHTTP + "ledger: {api_key_env: MADE_UP}", probe: true,
			logs: `cannot record findings" problem="ledger.api_key_env: the ledger refuses the key in MADE_UP`},
		{name: "an agent key to reconcile", yaml: overHTTP + "reconcile: {api_key_envs: [RECONCILER, AGENT]}",
			want: "reconcile.api_key_envs: the key in AGENT has scopes [agent]; it needs reconciler"},
		{name: "reconciler keys", yaml: stdio + "ledger: {api_key_env: AGENT}\nreconcile: {api_key_envs: [RECONCILER]}"},
		{name: "a ledger that does not answer", ledger: ledgertest.ClosedAddr(t), yaml: stdio + "ledger: {api_key_env: MADE_UP}",
			logs: "could not check the gateway's keys with the ledger"},
		{name: "a probe, reconciling under an agent key", yaml: stdio + "ledger: {api_key_env: AGENT}", probe: true,
			logs: `cannot record findings" problem="ledger.api_key_env: the key in AGENT has scopes [agent]; it needs reconciler"`},
		{name: "a probe, reconciling under a reconciler key", yaml: stdio + "ledger: {api_key_env: RECONCILER}", probe: true},
		{name: "a probe, reconciling under no key", yaml: overHTTP, probe: true,
			logs: `cannot record findings" problem="ledger.api_key_env is not set, and the ledger asks for an API key`},
		{name: "a probe, reconciler keys", yaml: stdio + "ledger: {api_key_env: AGENT}\nreconcile: {api_key_envs: [RECONCILER]}", probe: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(tc.yaml, "ledger: {", "ledger: {address: "+cmp.Or(tc.ledger, secured)+", ", 1)
			if !strings.Contains(doc, "ledger:") {
				doc += "\nledger: {address: " + cmp.Or(tc.ledger, secured) + "}"
			}
			rules := ""
			if tc.probe {
				rules = ", tools: [{match: create_ticket, probe: {tool: find_ticket}}]"
			}
			doc += "\nupstreams:\n  - {name: tickets, url: \"http://127.0.0.1:1/mcp\"" + rules + "}\n"
			cfg, err := mcpgateway.ParseConfig([]byte(doc), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			if err != nil {
				t.Fatal(err)
			}
			logs := &ledgertest.Buffer{}
			g, err := mcpgateway.New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			err = g.CheckKeys(context.Background())
			if got := fmt.Sprint(err); (tc.want == "") != (err == nil) || !strings.Contains(got, tc.want) {
				t.Fatalf("CheckKeys = %v, want %q", err, cmp.Or(tc.want, "nil"))
			}
			if err != nil && strings.Contains(err.Error(), env["MADE_UP"]) {
				t.Errorf("the error %q shows the key", err)
			}
			if !strings.Contains(logs.String(), tc.logs) || tc.logs == "" && strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("logs %q, want %q", logs, cmp.Or(tc.logs, "no warning"))
			}
		})
	}
}
