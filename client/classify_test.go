package client

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/opledger/ledger/internal/ledgertest"
)

func TestClassifyHTTP(t *testing.T) {
	for sc, want := range map[int]Class{
		408: Retryable, 425: Retryable, 429: Retryable,
		500: Ambiguous, 502: Ambiguous, 503: Ambiguous, 504: Ambiguous, 599: Ambiguous,
		400: Final, 401: Final, 403: Final, 404: Final, 409: Final, 422: Final,
	} {
		err := ClassifyHTTP(&http.Response{StatusCode: sc}, nil)
		if err == nil || ClassOf(err) != want {
			t.Errorf("HTTP %d: %v, class %v, want %v", sc, err, ClassOf(err), want)
		}
	}
	for _, sc := range []int{200, 201, 204, 302} {
		if err := ClassifyHTTP(&http.Response{StatusCode: sc}, nil); err != nil {
			t.Errorf("HTTP %d: %v", sc, err)
		}
	}
	if code := failureCode(ClassifyHTTP(&http.Response{StatusCode: 404}, nil)); code != "http_404" {
		t.Errorf("failure code %q", code)
	}
	// A request that could not connect is retryable; one that timed out is not.
	_, err := http.Get("http://" + ledgertest.ClosedAddr(t))
	if c := ClassOf(ClassifyHTTP(nil, err)); c != Retryable {
		t.Errorf("connection refused: %v (%v)", c, err)
	}
	hc := &http.Client{Timeout: time.Nanosecond}
	_, err = hc.Get("http://" + ledgertest.ClosedAddr(t))
	if c := ClassOf(ClassifyHTTP(nil, err)); c == Final {
		t.Errorf("timeout: %v (%v)", c, err)
	}
}

func TestClassifyGRPC(t *testing.T) {
	for c, want := range map[codes.Code]Class{
		codes.ResourceExhausted: Ambiguous, codes.Aborted: Ambiguous,
		codes.InvalidArgument: Final, codes.NotFound: Final, codes.AlreadyExists: Final,
		codes.PermissionDenied: Final, codes.Unauthenticated: Final, codes.FailedPrecondition: Final,
		codes.OutOfRange: Final, codes.Unimplemented: Final,
		codes.DeadlineExceeded: Ambiguous, codes.Unavailable: Ambiguous, codes.Internal: Ambiguous,
		codes.Unknown: Ambiguous, codes.DataLoss: Ambiguous, codes.Canceled: Ambiguous,
	} {
		if got := ClassOf(ClassifyGRPC(status.Error(c, "x"))); got != want {
			t.Errorf("%v: %v, want %v", c, got, want)
		}
	}
	if ClassifyGRPC(nil) != nil {
		t.Error("nil classified as an error")
	}
}

func TestClassOf(t *testing.T) {
	base := errors.New("x")
	for err, want := range map[error]Class{
		base:                                Ambiguous,
		context.DeadlineExceeded:            Ambiguous,
		MarkRetryable(base):                 Retryable,
		MarkFinal("c", base):                Final,
		MarkAmbiguous(MarkFinal("", base)):  Ambiguous,
		&net.OpError{Op: "dial", Err: base}: Retryable,
		&net.OpError{Op: "read", Err: base}: Ambiguous,
	} {
		if got := ClassOf(err); got != want {
			t.Errorf("ClassOf(%v) = %v, want %v", err, got, want)
		}
	}
	if !errors.Is(MarkRetryable(context.Canceled), context.Canceled) {
		t.Error("marking hides the cause")
	}
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	withInfo := func(c codes.Code, reason string) error {
		st, _ := status.New(c, "m").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "ledger.v1"},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(300 * time.Millisecond)},
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "tool", Description: "required"}}})
		return st.Err()
	}
	for reason, want := range map[string]error{
		"IDEMPOTENCY_KEY_REUSED":  ErrKeyReused,
		"IDEMPOTENCY_KEY_EXPIRED": ErrKeyExpired,
		"STALE_FENCING_TOKEN":     ErrStaleToken,
		"COMPLETION_CONFLICT":     ErrCompletionConflict,
		"ALREADY_RESOLVED":        ErrAlreadyResolved,
		"OPERATION_IN_PROGRESS":   ErrInProgress,
		"NOT_FOUND":               ErrNotFound,
		"INVALID_ARGUMENT":        ErrInvalidArgument,
		"STORE_UNAVAILABLE":       ErrUnavailable,
		"RATE_LIMITED":            ErrRateLimited,
		"UNRESOLVED_LIMIT":        ErrQuotaExceeded,
		"NOT_COMPENSABLE":         ErrNotCompensable,
	} {
		err := fromStatus(withInfo(codes.FailedPrecondition, reason))
		var e *Error
		if !errors.Is(err, want) || !errors.As(err, &e) || e.RetryAfter != 300*time.Millisecond || e.Violations[0].Field != "tool" {
			t.Errorf("%s: %v (%+v)", reason, err, e)
		}
		if errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s matches another sentinel", reason)
		}
	}
	for c, want := range map[codes.Code]error{
		codes.Unavailable: ErrUnavailable, codes.Unauthenticated: ErrUnauthenticated,
		codes.PermissionDenied: ErrPermissionDenied, codes.ResourceExhausted: ErrMessageTooLarge,
	} {
		if err := fromStatus(status.Error(c, "m")); !errors.Is(err, want) {
			t.Errorf("%v: %v", c, err)
		}
	}
	// RESOURCE_EXHAUSTED is a rate limit only with the ledger's reason; bare,
	// it is grpc-go's size limit, which no retry gets past.
	if err := fromStatus(withInfo(codes.ResourceExhausted, "RATE_LIMITED")); !errors.Is(err, ErrRateLimited) || errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("RESOURCE_EXHAUSTED with RATE_LIMITED: %v", err)
	}
	if err := fromStatus(status.Error(codes.ResourceExhausted, "grpc: received message larger than max")); errors.Is(err, ErrRateLimited) || errors.Is(err, ErrQuotaExceeded) {
		t.Errorf("bare RESOURCE_EXHAUSTED matches a back-off sentinel: %v", err)
	}
	// A reason of a later ledger that this SDK does not know is the ledger's
	// refusal, not the transport's size limit: it matches no sentinel.
	if err := fromStatus(withInfo(codes.ResourceExhausted, "SOME_LATER_QUOTA")); errors.Is(err, ErrMessageTooLarge) || errors.Is(err, ErrRateLimited) {
		t.Errorf("RESOURCE_EXHAUSTED with an unknown reason: %v", err)
	}
	if err := fromStatus(status.Error(codes.DeadlineExceeded, "m")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("DEADLINE_EXCEEDED: %v", err)
	}
	fe := &FailedError{Reason: "RETRIES_EXHAUSTED"}
	if !errors.Is(fe, ErrOperationFailed) || !errors.Is(fe, ErrRetriesExhausted) {
		t.Error("FailedError sentinels")
	}
	ex := &ExhaustedError{Ambiguous: true, Err: base()}
	if !errors.Is(ex, ErrRetriesExhausted) || !errors.Is(ex, ErrNeedsReconciliation) {
		t.Error("ExhaustedError sentinels")
	}
}

func base() error { return errors.New("x") }

func TestBackoffZeroFieldsTakeTheDefaults(t *testing.T) {
	if d := (Backoff{Base: 50 * time.Millisecond}).Delay(3); d < 200*time.Millisecond {
		t.Fatalf("Delay(3) with no Max = %v", d)
	}
	if d := (Backoff{}).Delay(1); d < DefaultBackoff.Base {
		t.Fatalf("zero Backoff Delay(1) = %v", d)
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	for n := 1; n <= 8; n++ {
		lo := min(b.Base<<(n-1), b.Max)
		hi := min(b.Base<<(n-1)+b.Base, b.Max)
		for range 50 {
			if d := b.Delay(n); d < lo || d > hi {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", n, d, lo, hi)
			}
		}
	}
}

func TestAPIKeyIsNotSentInClearBeyondLoopback(t *testing.T) {
	k := apiKey("id.secret")
	for uri, ok := range map[string]bool{
		"http://127.0.0.1:50051/ledger.v1.LedgerService": true,
		"http://[::1]:50051/ledger.v1.LedgerService":     true,
		"http://localhost:50051/ledger.v1.LedgerService": true,
		"http://10.1.2.3:50051/ledger.v1.LedgerService":  false,
		"http://ledger.example:443/x":                    false,
	} {
		md, err := k.GetRequestMetadata(context.Background(), uri)
		if ok != (err == nil) || ok && md["authorization"] != "Bearer id.secret" {
			t.Errorf("%s: %v, %v", uri, md, err)
		}
	}
}

func TestDialRefusesAKeyInClearBeyondLoopback(t *testing.T) {
	for target, ok := range map[string]bool{
		"127.0.0.1:50051": true, "localhost:50051": true, "[::1]:50051": true, "dns:///127.0.0.1:1": true,
		"unix:ledger.sock": true, "unix:///run/ledger.sock": true, "unix-abstract:ledger": true,
		"10.1.2.3:50051": false, "ledger.example:443": false, "dns:///ledger.example:443": false,
	} {
		c, err := Dial(target, WithAPIKey("id.secret"))
		if ok != (err == nil) || !ok && !errors.Is(err, ErrInsecureAPIKey) {
			t.Errorf("%s: %v", target, err)
		}
		if c != nil {
			_ = c.Close()
		}
	}
	c, err := Dial("ledger.example:443", WithAPIKey("id.secret"), WithTLS(&tls.Config{MinVersion: tls.VersionTLS12}))
	if err != nil {
		t.Fatalf("with TLS: %v", err)
	}
	_ = c.Close()
}
