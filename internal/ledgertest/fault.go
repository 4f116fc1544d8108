package ledgertest

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// Fault is a client interceptor that makes every call of one ledger method
// (its name, e.g. "MarkUnknown") fail as a ledger that gives no useful
// answer fails; other methods go through. Modes:
//
//   - "hung": no answer until the caller gives up (its context's status);
//   - "unavailable": UNAVAILABLE, as when the connection is refused;
//   - "cut": a transport status without the ledger's ErrorInfo, as when the
//     stream is reset;
//   - "not-found": the ledger's NOT_FOUND, as if it had lost the operation.
func Fault(method, mode string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if !strings.HasSuffix(m, "/"+method) {
			return invoker(ctx, m, req, reply, cc, opts...)
		}
		switch mode {
		case "hung":
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		case "unavailable":
			return status.Error(codes.Unavailable, "connection refused")
		case "not-found":
			st, _ := status.New(codes.NotFound, "no such operation").WithDetails(&errdetails.ErrorInfo{Reason: "NOT_FOUND", Domain: "ledger.v1"})
			return st.Err()
		default: // "cut"
			return status.Error(codes.Internal, "stream terminated by RST_STREAM with error code: INTERNAL_ERROR")
		}
	}
}

// SeeInProgress returns a client interceptor and a channel it closes once
// the ledger has answered a Reserve IN_PROGRESS: the caller is then waiting
// for another holder's claim.
func SeeInProgress() (grpc.UnaryClientInterceptor, <-chan struct{}) {
	waiting := make(chan struct{})
	var once sync.Once
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*ledgerv1.ReserveResponse); ok && err == nil && r.GetDecision() == ledgerv1.Decision_DECISION_IN_PROGRESS {
			once.Do(func() { close(waiting) })
		}
		return err
	}, waiting
}
