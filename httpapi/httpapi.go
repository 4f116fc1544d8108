// Package httpapi serves ledger.v1 as HTTP/JSON: grpc-gateway's mapping of
// every RPC (the google.api.http options of proto/ledger/v1/ledger.proto),
// forwarded over a gRPC connection to the ledger's own server, so that
// authentication, scopes, rate limits and errors are the gRPC service's;
// and the OpenAPI description at /v1/openapi.json.
package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/gen/openapi"
	"github.com/opledger/ledger/server"
)

// OpenAPIPath is where the OpenAPI description is served.
const OpenAPIPath = "/v1/openapi.json"

// setQueryParser sets the query parser, a global of grpc-gateway's, once.
var setQueryParser sync.Once

// Handler returns the HTTP/JSON API of the ledger service reached over
// conn. Requests carry the caller's credentials in the Authorization header
// ("Bearer <key>"), as gRPC calls do.
func Handler(conn *grpc.ClientConn) (http.Handler, error) {
	// protojson's defaults, not grpc-gateway's: answers without zero fields
	// (as grpcurl prints them), and a request field the message does not
	// have refused, not dropped.
	rt, err := newRoutes()
	if err != nil {
		return nil, err
	}
	params := &pathParams{rt: rt}
	m := &marshaler{}
	opts := []runtime.ServeMuxOption{
		// A form POSTed to a GET path is not read as that GET.
		runtime.WithDisablePathLengthFallback(),
		runtime.WithErrorHandler(errorHandler),
		runtime.WithRoutingErrorHandler(rt.routingError),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, m),
		runtime.WithMiddlewares(params.middleware),
		// The service sends no metadata of its own: only gRPC's
		// Content-Type, which is no header of an HTTP answer.
		runtime.WithOutgoingHeaderMatcher(func(string) (string, bool) { return "", false }),
	}
	setQueryParser.Do(func() { opts = append(opts, runtime.SetQueryParameterParser(&queryParser{})) })
	gw := runtime.NewServeMux(opts...)
	params.gw = gw
	if err := ledgerv1.RegisterLedgerServiceHandler(context.Background(), gw, conn); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+OpenAPIPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.JSON)
	})
	mux.Handle("/v1/", headAsGet(gw))
	// Any other path is one the API does not have, answered as one under
	// /v1/ is (a path that leaves /v1/ by "..", redirected, among them).
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		rt.routingError(r.Context(), gw, m, w, r, http.StatusNotFound)
	})
	return noStore(mux), nil
}

// noStore marks every answer of h not to be stored by any cache (an
// operation's record may hold what a tool returned), nor read by a browser
// as anything but its Content-Type.
func noStore(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

// errorHandler writes the gRPC status as JSON (code, message and details,
// the ErrorInfo among them), with the HTTP status of its code; the
// ledger's conflicts (FAILED_PRECONDITION) are 409. A status made before
// the service was called (a body, query or path refused here) gets the
// ErrorInfo the service would have given it.
func errorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	httpStatus := 0
	if hse := (*runtime.HTTPStatusError)(nil); errors.As(err, &hse) {
		httpStatus, err = hse.HTTPStatus, hse.Err
	}
	st := withErrorInfo(status.Convert(err))
	if httpStatus == 0 && st.Code() == codes.FailedPrecondition {
		httpStatus = http.StatusConflict
	}
	err = st.Err()
	if httpStatus != 0 {
		err = &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: err}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// reasons are the ErrorInfo reasons of the codes a status made outside the
// service may have.
var reasons = map[codes.Code]string{
	codes.InvalidArgument:  server.ReasonInvalidArgument,
	codes.PermissionDenied: server.ReasonPermissionDenied,
	codes.DeadlineExceeded: server.ReasonDeadlineExceeded,
	codes.Canceled:         server.ReasonCanceled,
	codes.Internal:         server.ReasonInternal,
}

// withErrorInfo returns st with an ErrorInfo of its code's reason when it
// has none, and for a request refused here (invalidPrefix) the field as a
// BadRequest violation.
func withErrorInfo(st *status.Status) *status.Status {
	reason, ok := reasons[st.Code()]
	if !ok || hasErrorInfo(st) {
		return st
	}
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: server.ErrorDomain}}
	if rest, ok := strings.CutPrefix(st.Message(), invalidPrefix); ok && st.Code() == codes.InvalidArgument {
		field, desc, _ := strings.Cut(rest, ": ")
		details = append(details, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: desc}}})
	}
	if with, err := st.WithDetails(details...); err == nil {
		return with
	}
	return st
}

func hasErrorInfo(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.ErrorInfo); ok {
			return true
		}
	}
	return false
}

// routingError answers a path the API does not have (404) and a method its
// path does not take (405, with the Allow header) with UNIMPLEMENTED, as
// gRPC answers a method it does not have: never NOT_FOUND, which says that
// no such operation or run exists.
func (rt *routes) routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	var err error
	switch httpStatus {
	case http.StatusNotFound:
		err = status.Error(codes.Unimplemented, "no such path: the paths are in "+OpenAPIPath)
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rt.allow(r))
		err = status.Error(codes.Unimplemented, "this path takes another method: the paths are in "+OpenAPIPath)
	default:
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
		return
	}
	errorHandler(ctx, mux, m, w, r, &runtime.HTTPStatusError{HTTPStatus: httpStatus, Err: err})
}
