package mcpgateway_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// TestGatewayStreamsPrimed: a go-sdk client whose GET event stream from
// the gateway ends every 50 ms (a proxy ending idle streams) keeps its
// session: a call of 2 s through it is answered, executed once.
func TestGatewayStreamsPrimed(t *testing.T) {
	var cuts atomic.Int64
	r := newRig(t, rigOptions{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.Method == http.MethodGet {
				cuts.Add(1)
				ctx, cancel := context.WithTimeout(req.Context(), 50*time.Millisecond)
				defer cancel()
				w, req = retrySoon{w}, req.WithContext(ctx)
			}
			h.ServeHTTP(w, req)
		})
	}})
	r.up.Fault("create_ticket", "slow:2s")
	cs := r.http("", clientOptions{})
	if a := call(t, cs, "tickets_create_ticket", ticketArgs, nil); a.outcome() != "executed" {
		t.Fatalf("the call = %v, want executed", a)
	}
	if n, m := cuts.Load(), r.up.Count("create_ticket"); n < 10 || m != 1 {
		t.Fatalf("%d event streams cut, %d effects; want 10 or more, and one", n, m)
	}
}
