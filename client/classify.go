package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Class says what a failed attempt proves about its effect, which decides
// what Do tells the ledger.
type Class int

// The classes of a failed attempt.
const (
	// Ambiguous: the effect may or may not exist (timeouts, lost responses,
	// HTTP 5xx, gRPC codes other than the final ones, anything
	// unclassified). Do calls MarkUnknown: an irreversible tool must be
	// reconciled before it runs again; an idempotent one is retried.
	Ambiguous Class = iota
	// Retryable: proven not applied (HTTP 408, 425 and 429, connection
	// refused, or marked so by the caller). Do completes the attempt as
	// FAILED_RETRYABLE and retries under the same operation id.
	Retryable
	// Final: the destination refused for good (a 4xx-class answer). Do
	// completes the operation as FAILED_FINAL; it is never retried.
	Final
)

// String names the class.
func (c Class) String() string {
	switch c {
	case Retryable:
		return "retryable"
	case Final:
		return "final"
	}
	return "ambiguous"
}

type classified struct {
	class           Class
	code            string
	message, detail string
	err             error
}

func (c *classified) Error() string { return c.err.Error() }
func (c *classified) Unwrap() error { return c.err }

// MarkRetryable wraps err to say the attempt is proven not to have applied
// the effect.
func MarkRetryable(err error) error { return &classified{class: Retryable, err: err} }

// MarkAmbiguous wraps err to say the attempt's effect cannot be told.
func MarkAmbiguous(err error) error { return &classified{class: Ambiguous, err: err} }

// MarkFinal wraps err to say the attempt failed for good; code is recorded as
// the operation's failure code (e.g. "card_declined"), or "tool_failed" when
// code is empty or the ledger refuses it (over 128 bytes, with a control
// character, or not valid UTF-8).
func MarkFinal(code string, err error) error {
	return &classified{class: Final, code: code, err: err}
}

// MarkFinalMessage is MarkFinal that also records message as the failure's
// message (cut to the ledger's 1 KiB), which a replay returns. The message
// is stored in the record: never put parameters or secrets in it.
func MarkFinalMessage(code, message string, err error) error {
	return &classified{class: Final, code: code, message: message, err: err}
}

// MarkFinalDetail is MarkFinal that also records detail as the failure's
// detail (cut to the ledger's 64 KiB), which a replay returns in
// FailedError.Detail: what the destination answered, e.g. a tool's error
// text. The ledger keeps it as it keeps result data, out of pages and logs.
func MarkFinalDetail(code, detail string, err error) error {
	return &classified{class: Final, code: code, detail: detail, err: err}
}

// ClassOf returns the class of an attempt's error: the one it was marked
// with (MarkRetryable, MarkFinal, MarkAmbiguous, or by ClassifyHTTP and
// ClassifyGRPC); Retryable for a connection that was never established
// (connection refused, a failed dial: nothing was sent); Ambiguous for
// everything else, timeouts and cancellations included.
func ClassOf(err error) Class {
	var c *classified
	if errors.As(err, &c) {
		return c.class
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return Ambiguous
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return Retryable
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return Retryable
	}
	return Ambiguous
}

// failureCode is the code recorded for a final failure.
func failureCode(err error) string {
	var c *classified
	if errors.As(err, &c) && c.code != "" {
		return c.code
	}
	return defaultFailureCode
}

// failureText returns the message and the detail recorded for a final
// failure: valid UTF-8, within the ledger's limits.
func failureText(err error) (message, detail string) {
	var c *classified
	if !errors.As(err, &c) {
		return "", ""
	}
	return cutUTF8(c.message, maxFailureMessage), cutUTF8(c.detail, maxFailureDetail)
}

// cutUTF8 returns s as valid UTF-8 of at most max bytes, cut at a
// character's start.
func cutUTF8(s string, max int) string {
	m := strings.ToValidUTF8(s, "\uFFFD")
	if len(m) <= max {
		return m
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(m[cut]) {
		cut--
	}
	return m[:cut]
}

// The ledger's limits on a failure's message and detail, in bytes.
const (
	maxFailureMessage = 1024
	maxFailureDetail  = 64 << 10
)

// defaultFailureCode is the failure code of a final failure whose error
// carries none (or one the ledger refuses).
const defaultFailureCode = "tool_failed"

// ClassifyHTTP classifies the outcome of an HTTP request to a destination:
// nil for 1xx–3xx; with err set, err marked by ClassOf (a refused
// connection is retryable, a timeout ambiguous); 408, 425 and 429 retryable
// (the server refused the request before processing it); 500, 502, 503, 504
// and other 5xx ambiguous (the request may have been processed); other 4xx
// final, with the code "http_<status>". The error names the status, never
// the body.
//
// 503 is ambiguous because it is not proof that nothing was applied: a proxy
// or load balancer answers 503 when its upstream resets the connection or
// fails after the request was forwarded, and the upstream may have applied
// the effect by then. Mark it retryable yourself (MarkRetryable) when the
// destination guarantees that its 503 means refused before processing and
// nothing between you and it answers 503 on its own.
func ClassifyHTTP(resp *http.Response, err error) error {
	if err != nil {
		return &classified{class: ClassOf(err), err: err}
	}
	if resp == nil || resp.StatusCode < 400 {
		return nil
	}
	e := fmt.Errorf("http %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	switch sc := resp.StatusCode; {
	case sc == http.StatusRequestTimeout, sc == http.StatusTooEarly, sc == http.StatusTooManyRequests:
		return MarkRetryable(e)
	case sc >= 500:
		return MarkAmbiguous(e)
	default:
		return MarkFinal(fmt.Sprintf("http_%d", sc), e)
	}
}

// ClassifyGRPC classifies the error of a gRPC call to a destination: nil for
// nil; INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// UNAUTHENTICATED, FAILED_PRECONDITION, OUT_OF_RANGE and UNIMPLEMENTED final,
// with the code name as failure code; everything else ambiguous
// (DEADLINE_EXCEEDED, UNAVAILABLE, INTERNAL, UNKNOWN, RESOURCE_EXHAUSTED,
// ABORTED, ...).
//
// No code is retryable on its own, because none proves that nothing was
// applied: UNAVAILABLE does not say whether the request reached the server;
// grpc-go itself returns RESOURCE_EXHAUSTED when a message exceeds a size
// limit in either direction, so also when the response is too large for the
// caller after the server applied the effect (or when the server's own reply
// exceeds its send limit); and ABORTED is whatever the server's handler
// makes of it, after a partial effect too. Mark the error retryable yourself
// (MarkRetryable) when the destination guarantees that a code means refused
// before anything was applied, e.g. a rate limit answered in front of the
// handler.
func ClassifyGRPC(err error) error {
	if err == nil {
		return nil
	}
	switch c := status.Code(err); c {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented:
		return MarkFinal(c.String(), err)
	}
	return MarkAmbiguous(err)
}
