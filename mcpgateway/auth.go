package mcpgateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
)

// verifiedFor is how long a key the ledger accepted is taken without
// asking it again. The ledger checks the key on every call anyway: this
// only spares a round trip per HTTP request.
const verifiedFor = time.Minute

// verifier checks callers' API keys with the ledger, which owns them.
type verifier struct {
	g    *Gateway
	mu   sync.Mutex
	seen map[[32]byte]taken // by the key's hash
}

// taken is a key the ledger took: until when, and its tenant.
type taken struct {
	until  time.Time
	tenant string
}

// errCannotCheck: the ledger did not answer whether it takes a key.
var errCannotCheck = errors.New("the ledger could not check the key; try again shortly")

// verdictKey carries, in a request's context, what precheck found of its
// key.
type verdictKey struct{}

type verdict struct {
	info *auth.TokenInfo
	err  error
}

// precheck checks the request's bearer key before go-sdk's middleware,
// which answers an error it does not know with 500: a key the ledger could
// not check is answered 503, with Retry-After, and false. Otherwise the
// verdict rides in the returned request, for verify to hand back.
func (v *verifier) precheck(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	fields := strings.Fields(r.Header.Get("Authorization"))
	if len(fields) != 2 || !strings.EqualFold(fields[0], "bearer") {
		return r, true // go-sdk refuses it
	}
	info, err := v.check(r.Context(), fields[1])
	if errors.Is(err, errCannotCheck) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return r, false
	}
	return r.WithContext(context.WithValue(r.Context(), verdictKey{}, verdict{info, err})), true
}

// verify is the auth.TokenVerifier of the HTTP listener: precheck's
// verdict on the request's key, else check's.
func (v *verifier) verify(ctx context.Context, key string, r *http.Request) (*auth.TokenInfo, error) {
	if r != nil {
		if vd, ok := r.Context().Value(verdictKey{}).(verdict); ok {
			return vd.info, vd.err
		}
	}
	return v.check(ctx, key)
}

// check asks the ledger whether it takes key (GetCaller), or remembers
// that it did. The key and its tenant ride in the TokenInfo to the call's
// handler; UserID, the key's id, binds a session to the key. It returns
// auth.ErrInvalidToken for a key the ledger refuses, errCannotCheck when
// the ledger does not answer.
func (v *verifier) check(ctx context.Context, key string) (*auth.TokenInfo, error) {
	id, _, ok := strings.Cut(key, ".")
	if !ok || id == "" {
		return nil, auth.ErrInvalidToken
	}
	h := sha256.Sum256([]byte(key))
	v.mu.Lock()
	k, known := v.seen[h]
	v.mu.Unlock()
	if !known || !time.Now().Before(k.until) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// A client of its own: the gateway keeps one per key it serves, and
		// a key the ledger refuses must leave nothing behind.
		c, err := client.New(v.g.conn, client.WithAPIKey(key)).Caller(ctx)
		switch {
		case errors.Is(err, client.ErrUnauthenticated):
			return nil, auth.ErrInvalidToken
		case err != nil:
			return nil, errCannotCheck
		}
		k = taken{until: time.Now().Add(verifiedFor), tenant: c.Tenant}
		v.mu.Lock()
		if v.seen == nil || len(v.seen) >= maxIntents {
			v.seen = map[[32]byte]taken{}
		}
		v.seen[h] = k
		v.mu.Unlock()
	}
	return &auth.TokenInfo{UserID: id, Extra: map[string]any{"key": key, "tenant": k.tenant}}, nil
}

// callerTenant is the tenant a call acts for, for the metrics: the HTTP
// caller's key's, or the gateway's own key's (asked of the ledger until it
// answers, without holding up other calls); "" when it could not say.
func (g *Gateway) callerTenant(ctx context.Context, req *mcp.CallToolRequest) string {
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		if t, ok := req.Extra.TokenInfo.Extra["tenant"].(string); ok {
			return t
		}
	}
	g.own.mu.Lock()
	tenant := g.own.tenant
	g.own.mu.Unlock()
	if tenant != "" {
		return tenant
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := g.ledger(g.cfg.Ledger.apiKey).Caller(ctx)
	if err != nil {
		return ""
	}
	g.own.mu.Lock()
	g.own.tenant = c.Tenant
	g.own.mu.Unlock()
	return c.Tenant
}

// callerKey is the API key a call acts under: the HTTP caller's bearer
// key, or the gateway's own (stdio, and anonymous HTTP on loopback).
func (g *Gateway) callerKey(req *mcp.CallToolRequest) string {
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		if k, ok := req.Extra.TokenInfo.Extra["key"].(string); ok {
			return k
		}
	}
	return g.cfg.Ledger.apiKey
}

// Handler serves MCP over Streamable HTTP at the configured path. A
// request needs "Authorization: Bearer <ledger API key>", which names its
// tenant, unless anonymous requests are allowed. HealthPath answers
// health probes without credentials.
func (g *Gateway) Handler() http.Handler {
	mcpHandler := primeStreams(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{
		Logger:         g.log,
		SessionTimeout: time.Duration(g.cfg.HTTP.SessionIdleTimeout),
	}))
	bearer := auth.RequireBearerToken(g.auth.verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(mcpHandler)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == g.cfg.HTTP.Path {
			// Close waits for the request, until its answer is written.
			if !g.posts.begin() {
				w.Header().Set("Retry-After", "1")
				http.Error(w, "the gateway is shutting down; send the request again", http.StatusServiceUnavailable)
				return
			}
			defer g.posts.end()
			// A body sent slowly would hold its connection for as long as
			// its client likes. net/http ends the deadline once the body
			// is read, so the answer's event stream is not cut by it.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyReadTimeout))
		}
		switch {
		case r.URL.Path == HealthPath:
			g.serveHealth(w, r)
		case r.URL.Path != g.cfg.HTTP.Path:
			http.NotFound(w, r)
		case g.cfg.HTTP.Anonymous && r.Header.Get("Authorization") == "":
			mcpHandler.ServeHTTP(w, r)
		default:
			if r, ok := g.auth.precheck(w, r); ok {
				bearer.ServeHTTP(w, r)
			}
		}
	})
}

// bodyReadTimeout bounds the reading of a POST's body.
var bodyReadTimeout = time.Minute

// ownKey is one of the gateway's own keys: the variable it came from, the
// key, the scopes of which it needs one, and whether a key that fails is
// only warned about, since only background reconciliation would fail.
type ownKey struct {
	field, env, key string
	needs           []string
	warn            bool
}

// ownKeys lists the keys the gateway acts under: its ledger key, when
// calls act under it (stdio, anonymous HTTP) or background reconciliation
// does (tool rules with a probe and no reconcile.api_key_envs); and the
// reconciler keys.
func (g *Gateway) ownKeys() []ownKey {
	var keys []ownKey
	l := g.cfg.Ledger
	if g.cfg.HTTP.Listen == "" || g.cfg.HTTP.Anonymous {
		keys = append(keys, ownKey{"ledger.api_key_env", l.APIKeyEnv, l.apiKey, []string{"agent", "reconciler"}, false})
	}
	if len(g.cfg.Reconcile.APIKeyEnvs) == 0 && g.cfg.probes() {
		keys = append(keys, ownKey{"ledger.api_key_env", l.APIKeyEnv, l.apiKey, []string{"reconciler"}, true})
	}
	for i, env := range g.cfg.Reconcile.APIKeyEnvs {
		keys = append(keys, ownKey{"reconcile.api_key_envs", env, g.cfg.Reconcile.apiKeys[i], []string{"reconciler"}, false})
	}
	return keys
}

// CheckKeys asks the ledger about each of the gateway's own keys (GetCaller)
// and returns an error naming the first it refuses, or that lacks the scope
// its use needs: every call under such a key would be refused. A key only
// background reconciliation acts under is warned about instead, and so is
// a ledger that does not answer: it may be starting too.
func (g *Gateway) CheckKeys(ctx context.Context) error {
	type answer struct {
		c   *client.Caller
		err error
	}
	asked := map[string]answer{} // the ledger key may serve two uses
	for _, k := range g.ownKeys() {
		a, ok := asked[k.key]
		if !ok {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			a.c, a.err = g.ledger(k.key).Caller(cctx)
			cancel()
			asked[k.key] = a
		}
		if a.err != nil && !errors.Is(a.err, client.ErrUnauthenticated) && !errors.Is(a.err, client.ErrPermissionDenied) {
			g.log.Warn("could not check the gateway's keys with the ledger", "error", a.err)
			return nil
		}
		err := keyProblem(k, a.c, a.err)
		if err != nil && k.warn {
			g.log.Warn("tool rules have probes, but background reconciliation cannot record findings", "problem", err)
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// keyProblem is what is wrong with key k, given the ledger's answer about
// it: refused (err), or without a scope it needs; nil for nothing.
func keyProblem(k ownKey, c *client.Caller, err error) error {
	switch {
	case err != nil && k.env == "":
		return fmt.Errorf("%s is not set, and the ledger asks for an API key: %v", k.field, err)
	case err != nil:
		return fmt.Errorf("%s: the ledger refuses the key in %s: %v", k.field, k.env, err)
	case !slices.ContainsFunc(k.needs, func(s string) bool { return slices.Contains(c.Scopes, s) }):
		return fmt.Errorf("%s: the key in %s has scopes %v; it needs %s", k.field, k.env, c.Scopes, strings.Join(k.needs, " or "))
	}
	return nil
}
