package servicetest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/opledger/ledger/httpapi"
	"github.com/opledger/ledger/server"
)

// HTTPStack is a ledger service with API keys, behind the HTTP/JSON API.
type HTTPStack struct {
	// URL is the HTTP server's base URL, and Addr the gRPC service's
	// address behind it.
	URL, Addr string
	// Keys are the API keys by scope (agent, reconciler, viewer), all of one
	// tenant; their ids are the prefix given to StartHTTP, "-", the scope.
	Keys map[string]string
}

// Keys makes one API key per scope (agent, reconciler, viewer) of tenant,
// with ids prefix-scope; it returns them by scope, and the credentials
// that hold them (Options.Credentials).
func Keys(tb testing.TB, tenant, prefix string) (map[string]string, *server.Credentials) {
	tb.Helper()
	keys, lines := map[string]string{}, []string{}
	for _, scope := range []string{"agent", "reconciler", "viewer"} {
		key, hash, err := server.NewAPIKey(prefix + "-" + scope)
		if err != nil {
			tb.Fatal(err)
		}
		keys[scope] = key
		lines = append(lines, fmt.Sprintf("  - {id: %s-%s, tenant: %q, scopes: [%s], secret_sha256: %s}", prefix, scope, tenant, scope, hash))
	}
	creds, err := server.ParseCredentials([]byte("keys:\n" + strings.Join(lines, "\n") + "\n"))
	if err != nil {
		tb.Fatal(err)
	}
	return keys, creds
}

// StartHTTP runs a ledger service on rdb with the test policy o.Policy and
// one API key per scope, and serves the HTTP/JSON API in front of it, with
// extra handlers (pattern → handler) on the same server, until the test
// ends. o.Credentials is replaced by the keys.
func StartHTTP(tb testing.TB, rdb redis.UniversalClient, o Options, tenant, prefix string, extra map[string]http.Handler) *HTTPStack {
	tb.Helper()
	keys, creds := Keys(tb, tenant, prefix)
	o.Credentials = creds
	st := Start(tb, rdb, o)
	conn, err := grpc.NewClient(st.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	api, err := httpapi.Handler(conn)
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	for pattern, h := range extra {
		mux.Handle(pattern, h)
	}
	mux.Handle("/", api)
	// Protected as a ledgerd without credentials is, the stricter way: a
	// page's own writes (the console's) must pass it.
	srv := httptest.NewServer(httpapi.Protect(mux, true))
	tb.Cleanup(srv.Close)
	return &HTTPStack{URL: srv.URL, Addr: st.Addr, Keys: keys}
}
