package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/redistest"
)

// receipts is a destination that applies every request it gets (it honours
// no idempotency key) and remembers the operation ids it applied.
type receipts struct {
	mu      sync.Mutex
	applied []string
}

func (r *receipts) apply(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, id)
}

func (r *receipts) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied)
}

// reconciler finds an applied operation by its id.
func (r *receipts) reconciler(ctx context.Context, op *client.Operation) (client.Finding, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range r.applied {
		if id == op.ID {
			return client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: "T-1"}, Note: "found"}, nil
		}
	}
	return client.Finding{Kind: client.NotApplied, Note: "not found"}, nil
}

// irreversible is the policy of the destinations' tools: a failure the SDK
// took for proof of "not applied" would run them again.
var irreversible = client.ToolPolicy{Timeout: 5 * time.Second, MaxRetries: 2, Effect: client.EffectIrreversible}

// A gRPC destination applies the effect, then its response is larger than
// the caller accepts: grpc-go fails the call with RESOURCE_EXHAUSTED on the
// caller's side. That is no proof of "not applied": the attempt is
// ambiguous, and the reconciler finds the effect instead of a retry
// applying it again.
func TestDoGRPCResponseTooLargeAfterTheEffectIsAmbiguous(t *testing.T) {
	dest := &receipts{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "tickets.Tickets",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := &wrapperspb.StringValue{}
			if err := dec(in); err != nil {
				return nil, err
			}
			dest.apply(in.GetValue())
			return wrapperspb.String(strings.Repeat("x", 4096)), nil // a large receipt
		}}},
	}, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })

	e := newEnv(t, redistest.Shared(t).Client(t))
	e.c.SetToolPolicy("tickets.create", irreversible)
	e.c.RegisterReconciler("tickets.create", dest.reconciler)
	op := e.op("ticket", "tickets.create", map[string]any{"title": "t"})
	res, err := e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		out := &wrapperspb.StringValue{}
		if err := cc.Invoke(ctx, "/tickets.Tickets/Create", wrapperspb.String(a.OperationID), out, grpc.MaxCallRecvMsgSize(1024)); err != nil {
			return client.Result{}, client.ClassifyGRPC(err)
		}
		return client.Result{ResourceID: "T-1"}, nil
	})
	if n := dest.total(); n != 1 {
		t.Fatalf("the destination applied the effect %d times, want 1 (Do = %+v, %v)", n, res, err)
	}
	if err != nil || res.ResourceID != "T-1" || !res.Replayed {
		t.Fatalf("Do = %+v, %v; want the reconciled effect", res, err)
	}
}

// An HTTP destination behind a proxy applies the effect, then resets the
// connection; the proxy answers 503. That is no proof of "not applied"
// either: without a reconciler the operation waits for one, and nothing
// runs again.
func TestDoHTTP503FromAProxyAfterTheEffectIsAmbiguous(t *testing.T) {
	dest := &receipts{}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dest.apply(r.Header.Get("Idempotency-Key"))
		panic(http.ErrAbortHandler) // the connection drops before the response
	}))
	t.Cleanup(upstream.Close)
	target, err := url.Parse(upstream.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, "upstream connect error or disconnect/reset before headers", http.StatusServiceUnavailable)
	}
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)

	e := newEnv(t, redistest.Shared(t).Client(t))
	e.c.SetToolPolicy("tickets.create", irreversible)
	op := e.op("ticket", "tickets.create", map[string]any{"title": "t"})
	_, err = e.c.Do(e.ctx, op, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/tickets", nil)
		if err != nil {
			return client.Result{}, client.MarkFinal("bad_request", err)
		}
		req.Header.Set("Idempotency-Key", a.IdempotencyKey)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		if err := client.ClassifyHTTP(resp, err); err != nil {
			return client.Result{}, err
		}
		return client.Result{ResourceID: "T-1"}, nil
	})
	if n := dest.total(); n != 1 {
		t.Fatalf("the destination applied the effect %d times, want 1 (Do: %v)", n, err)
	}
	if !errors.Is(err, client.ErrNeedsReconciliation) {
		t.Fatalf("Do: %v; want ErrNeedsReconciliation", err)
	}
}
