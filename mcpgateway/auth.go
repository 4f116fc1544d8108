package mcpgateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
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

// credentialsProbe is the operation id the gateway looks up to learn
// whether the ledger takes a key.
const credentialsProbe = "ledgermcp:credentials-check"

// verifier checks callers' API keys with the ledger, which owns them.
type verifier struct {
	g    *Gateway
	mu   sync.Mutex
	seen map[[32]byte]time.Time // key hash -> until when it is taken
}

// verify is the auth.TokenVerifier of the HTTP listener: the ledger must
// take the key. The key rides in the TokenInfo to the call's handler;
// UserID, the key's id, binds a session to the key.
func (v *verifier) verify(ctx context.Context, key string, _ *http.Request) (*auth.TokenInfo, error) {
	id, _, ok := strings.Cut(key, ".")
	if !ok || id == "" {
		return nil, auth.ErrInvalidToken
	}
	h := sha256.Sum256([]byte(key))
	info := &auth.TokenInfo{UserID: id, Extra: map[string]any{"key": key}}
	v.mu.Lock()
	until, known := v.seen[h]
	v.mu.Unlock()
	if known && time.Now().Before(until) {
		return info, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := v.g.ledger(key).Lookup(ctx, credentialsProbe)
	switch {
	case err == nil, errors.Is(err, client.ErrNotFound), errors.Is(err, client.ErrPermissionDenied):
	case errors.Is(err, client.ErrUnauthenticated):
		return nil, auth.ErrInvalidToken
	default:
		return nil, errors.New("the ledger could not check the key")
	}
	v.mu.Lock()
	if v.seen == nil || len(v.seen) >= maxIntents {
		v.seen = map[[32]byte]time.Time{}
	}
	v.seen[h] = time.Now().Add(verifiedFor)
	v.mu.Unlock()
	return info, nil
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
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return g.server }, &mcp.StreamableHTTPOptions{
		Logger:         g.log,
		SessionTimeout: time.Duration(g.cfg.HTTP.SessionIdleTimeout),
	})
	bearer := auth.RequireBearerToken(g.auth.verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(mcpHandler)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == HealthPath:
			g.serveHealth(w, r)
		case r.URL.Path != g.cfg.HTTP.Path:
			http.NotFound(w, r)
		case g.cfg.HTTP.Anonymous && r.Header.Get("Authorization") == "":
			mcpHandler.ServeHTTP(w, r)
		default:
			bearer.ServeHTTP(w, r)
		}
	})
}
