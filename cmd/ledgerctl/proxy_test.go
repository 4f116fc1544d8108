package main

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// proxy stands between ledgerctl and a ledger: it passes ListUnresolved,
// Reconcile and Lookup on, and counts what the ledger answers. As an older
// ledger (old), it drops what such a ledger did not have: the overdue and
// needs_review filters on the way (a ledger that does not know them ignores
// them), and the history in Reconcile's answer; and it answers as such a
// ledger did an applied (abandon) finding on an operation already
// SUCCEEDED (FAILED_FINAL) with another result (failure): OK, with the
// record that stands.
type proxy struct {
	ledgerv1.UnimplementedLedgerServiceServer
	next ledgerv1.LedgerServiceClient
	old  bool
	// afterReconcile, when set, runs once Reconcile has taken effect, before
	// its answer goes back.
	afterReconcile func()
	// afterRefusal, when set, runs once the ledger has refused a
	// Reconcile, before the refusal goes back.
	afterRefusal func()
	// lookupErr, when set, is the answer to every Lookup.
	lookupErr error
	// stuckToken, when set, is the next page token of every ListUnresolved
	// answer, which reads the first page whatever token it is sent: a
	// ledger whose pages do not advance.
	stuckToken string

	mu      sync.Mutex
	listed  int // operations the ledger returned to ListUnresolved
	lookups int // Lookup calls
}

// startProxy runs a proxy to the ledger at addr and returns its address.
func startProxy(t *testing.T, addr string, old bool) (*proxy, string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	p := &proxy{next: ledgerv1.NewLedgerServiceClient(conn), old: old}
	srv := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(srv, p)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return p, lis.Addr().String()
}

// forward passes the caller's credentials on.
func forward(ctx context.Context) context.Context {
	md, _ := metadata.FromIncomingContext(ctx)
	auth := ""
	if v := md.Get("authorization"); len(v) > 0 {
		auth = v[0]
	}
	return metadata.NewOutgoingContext(ctx, metadata.Pairs("authorization", auth))
}

func (p *proxy) ListUnresolved(ctx context.Context, req *ledgerv1.ListUnresolvedRequest) (*ledgerv1.ListUnresolvedResponse, error) {
	if p.old {
		req.Overdue, req.NeedsReview = false, false
	}
	if p.stuckToken != "" {
		req.PageToken = ""
	}
	res, err := p.next.ListUnresolved(forward(ctx), req)
	if err == nil && p.stuckToken != "" {
		res.NextPageToken = p.stuckToken
	}
	if err == nil {
		p.mu.Lock()
		p.listed += len(res.GetOperations())
		p.mu.Unlock()
	}
	return res, err
}

func (p *proxy) Reconcile(ctx context.Context, req *ledgerv1.ReconcileRequest) (*ledgerv1.ReconcileResponse, error) {
	res, err := p.next.Reconcile(forward(ctx), req)
	if err != nil && p.afterRefusal != nil {
		p.afterRefusal()
	}
	if p.old && err != nil {
		own := map[ledgerv1.Finding]ledgerv1.State{
			ledgerv1.Finding_FINDING_APPLIED: ledgerv1.State_STATE_SUCCEEDED,
			ledgerv1.Finding_FINDING_ABANDON: ledgerv1.State_STATE_FAILED_FINAL,
		}[req.GetFinding()]
		if ei := errorInfo(err); ei != nil && ei.Reason == "ALREADY_RESOLVED" && own != ledgerv1.State_STATE_UNSPECIFIED &&
			ei.Metadata["state"] == own.String() {
			look, lerr := p.next.Lookup(forward(ctx), &ledgerv1.LookupRequest{OperationId: req.GetOperationId()})
			if lerr != nil {
				return nil, lerr
			}
			res, err = &ledgerv1.ReconcileResponse{Operation: look.GetOperation()}, nil
		}
	}
	if err == nil {
		if p.afterReconcile != nil {
			p.afterReconcile()
		}
		if p.old {
			res.GetOperation().History = nil
		}
	}
	return res, err
}

func (p *proxy) Lookup(ctx context.Context, req *ledgerv1.LookupRequest) (*ledgerv1.LookupResponse, error) {
	p.mu.Lock()
	p.lookups++
	p.mu.Unlock()
	if p.lookupErr != nil {
		return nil, p.lookupErr
	}
	return p.next.Lookup(forward(ctx), req)
}

// take returns how many operations the ledger listed, and how many Lookup
// calls it answered, since the last take.
func (p *proxy) take() (listed, lookups int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	listed, lookups = p.listed, p.lookups
	p.listed, p.lookups = 0, 0
	return listed, lookups
}

// errorInfo is the ErrorInfo detail of a gRPC error, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei
		}
	}
	return nil
}
