package mcpgateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/mcpgateway"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestParseConfig: a full file is read with its defaults filled in and
// ${NAME} expanded from the environment.
func TestParseConfig(t *testing.T) {
	c, err := mcpgateway.ParseConfig([]byte(`
ledger:
  api_key_env: GW_KEY
http:
  listen: 127.0.0.1:8931
defaults:
  window: 5m
reconcile:
  api_key_envs: [ACME_RECONCILER]
upstreams:
  - name: tickets
    command: [tickets-server, --db, /var/lib/tickets]
    env: {TICKETS_TOKEN: "${TOKEN}", PLAIN: "a$b"}
    tools:
      - match: create_*
        effect: irreversible
        params: [/title]
        probe: {tool: find_ticket}
  - name: crm
    prefix: ""
    url: https://crm.example/s/${CRM_PATH}/mcp
    headers: {Authorization: "Bearer ${CRM_TOKEN}"}
`), env(map[string]string{"GW_KEY": "gw.s", "ACME_RECONCILER": "acme.s", "TOKEN": "t0k", "CRM_TOKEN": "c", "CRM_PATH": "k3y"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Ledger.Address != "127.0.0.1:50051" || c.HTTP.Path != "/mcp" || time.Duration(c.HTTP.SessionIdleTimeout) != time.Hour || time.Duration(c.Reconcile.Interval) != 10*time.Second ||
		*c.HTTP.MaxConnections != 10000 {
		t.Errorf("defaults not filled in: %+v", c)
	}
	u := c.Upstreams[0]
	if *u.Prefix != "tickets_" || u.Env["TICKETS_TOKEN"] != "t0k" || u.Env["PLAIN"] != "a$b" {
		t.Errorf("upstream %+v: want prefix tickets_ and the token expanded", u)
	}
	if p := u.Tools[0].Probe; p.Argument != "idempotency_key" || time.Duration(p.NotFoundAfter) != 30*time.Second {
		t.Errorf("probe %+v: want the defaults", p)
	}
	if *c.Upstreams[1].Prefix != "" || c.Upstreams[1].Headers["Authorization"] != "Bearer c" || c.Upstreams[1].URL != "https://crm.example/s/k3y/mcp" {
		t.Errorf("crm %+v", c.Upstreams[1])
	}
}

// TestParseConfigRefuses: each mistake is refused with a message naming
// what is wrong, and never quotes a secret.
func TestParseConfigRefuses(t *testing.T) {
	const up = "upstreams:\n  - {name: t, command: [x]}\n"
	for _, tc := range []struct{ doc, want string }{
		{"", "at least one upstream"},
		{"upstreams: []", "at least one is needed"},
		{"bogus: 1\n" + up, "line 1: unknown field bogus"},
		{"upstreams:\n  - {name: t, command: x}\n", "line 2: text where a list belongs"},
		{up + "---\n" + up, "exactly one YAML document"},
		{"ledger: {address: nowhere}\n" + up, "want HOST:PORT"},
		{"ledger: {api_key_env: UNSET}\n" + up, "UNSET is not set"},
		{"ledger: {api_key_env: SECRET, address: x}\n" + up, "want HOST:PORT"},
		{"upstreams:\n  - {name: t, url: 'http://h/mcp', headers: {A: '${SECRET}'}, env: {B: '${SECRET}'}}", "only with command"},
		{"http: {listen: 0.0.0.0:8931}\n" + up, "need tls"},
		{"http: {listen: 0.0.0.0:8931, anonymous: true, tls: {cert_file: c, key_file: k}}\n" + up, "only on a loopback listener"},
		{"http: {path: mcp}\n" + up, "absolute path"},
		{"http: {path: /healthz}\n" + up, "the health probe's"},
		{"metrics: {listen: '9465'}\n" + up, "metrics: listen \"9465\": want HOST:PORT"},
		{"reconcile: {interval: 1ms}\n" + up, "at least 100ms"},
		{"defaults: {timeout: 30}\n" + up, "want a duration"},
		{"defaults: {window: 1d}\n" + up, "line 1: want a duration such as 30s or 10m (units: ms, s, m, h; no d)"},
		{"defaults: {wait: 0s}\n" + up, "line 1: 0s: want a positive duration (leave the field out for its default)"},
		{"http: {session_idle_timeout: 0s}\n" + up, "line 1: 0s: want a positive duration"},
		{"http: {max_connections: -1}\n" + up, "http: max_connections -1: want 0 (no limit) or more"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, window: -1m}]}", "line 2: -1m: want a positive duration"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, probe: {tool: f, not_found_after: 0s}}]}", "line 2: 0s: want a positive duration"},
		{"defaults: {key: none}\n" + up, "key none would forward"},
		{"defaults: {effect: read_only}\n" + up, "belong to a tool rule"},
		{"upstreams:\n  - {name: T, command: [x]}", "lowercase"},
		{"upstreams:\n  - {name: t}", "command or url"},
		{"upstreams:\n  - {name: t, command: [x], url: 'http://h/mcp'}", "give one"},
		{"upstreams:\n  - {name: t, url: 'ftp://h/mcp'}", "want http"},
		{"upstreams:\n  - {name: t, url: 'http://h/${NOPE}/mcp'}", "url: the environment variable NOPE is not set"},
		{"upstreams:\n  - {name: t, url: '${SECRET}://h/mcp'}", "url \"${SECRET}://h/mcp\": want http"},
		{"upstreams:\n  - {name: t, command: [x], headers: {a: b}}", "only with url"},
		{"upstreams:\n  - {name: t, command: [x], env: {A: '${NOPE}'}}", "NOPE is not set"},
		{"upstreams:\n  - {name: t, command: [x], env: {C: '${NOPE3}', A: '${NOPE1}', B: '${NOPE2}'}}", "A: the environment variable NOPE1 is not set"},
		{"upstreams:\n  - {name: t, command: [x]}\n  - {name: t, command: [y]}", "second upstream"},
		{"upstreams:\n  - {name: a, prefix: x_, command: [x]}\n  - {name: b, prefix: x_, command: [y]}", "another upstream's too"},
		{"upstreams:\n  - {name: t, prefix: 'a b', command: [x]}", "prefix \"a b\": may only hold letters, digits and . _ - : /, up to 128 with the tool's name"},
		{"upstreams:\n  - {name: t, prefix: " + strings.Repeat("p", 129) + ", command: [x]}", "up to 128 with the tool's name"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{effect: irreversible}]}", "match is required"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, effect: risky}]}", "want read_only"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, key: never}]}", "want session, require or none"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, key: none, effect: irreversible}]}", "only for read-only tools"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, errors: maybe}]}", "want final or retryable"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, retries: 11}]}", "want 0 to 10"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, params: [amount]}]}", "JSON pointer"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, probe: {argument: k}}]}", "probe.tool is required"},
		{"upstreams:\n  - {name: t, command: [x], tools: [{match: a, window: -1s}]}", "positive duration"},
		{"upstreams:\n  - name: t\n    command: [x]\n    ~: 1", "reads as YAML's null"},
	} {
		// Maps are walked in random order: the error must not follow it.
		for range 10 {
			_, err := mcpgateway.ParseConfig([]byte(tc.doc), env(map[string]string{"SECRET": "hunter2"}))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%q: error %v, want one saying %q", tc.doc, err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("%q: the error quotes a secret: %v", tc.doc, err)
			}
		}
	}
}

// FuzzParseConfig: no document makes ParseConfig panic, and one it takes
// has an upstream and a ledger address.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"upstreams:\n  - {name: t, command: [x]}\n",
		"upstreams:\n  - {name: t, url: 'http://h/mcp', headers: {a: '${A}'}}\n",
		"http: {listen: '127.0.0.1:1', anonymous: true}\nupstreams:\n  - {name: t, command: [x], tools: [{match: '*', probe: {tool: p}}]}\n",
		"defaults: {window: 1m}\nupstreams: [{name: a, command: [x]}]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := mcpgateway.ParseConfig([]byte(doc), env(map[string]string{"A": "1"}))
		if err == nil && (len(c.Upstreams) == 0 || c.Ledger.Address == "") {
			t.Fatalf("accepted %q without an upstream or an address", doc)
		}
	})
}
