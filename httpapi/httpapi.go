// Package httpapi serves ledger.v1 as HTTP/JSON: grpc-gateway's mapping of
// every RPC (the google.api.http options of proto/ledger/v1/ledger.proto),
// forwarded over a gRPC connection to the ledger's own server, so that
// authentication, scopes, rate limits and errors are the gRPC service's;
// and the OpenAPI description at /v1/openapi.json.
package httpapi

import (
	"context"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/gen/openapi"
)

// OpenAPIPath is where the OpenAPI description is served.
const OpenAPIPath = "/v1/openapi.json"

// Handler returns the HTTP/JSON API of the ledger service reached over
// conn. Requests carry the caller's credentials in the Authorization header
// ("Bearer <key>"), as gRPC calls do.
func Handler(conn *grpc.ClientConn) (http.Handler, error) {
	// protojson's defaults, not grpc-gateway's: answers without zero fields
	// (as grpcurl prints them), and a request field the message does not
	// have refused, not dropped.
	gw := runtime.NewServeMux(
		runtime.WithErrorHandler(errorHandler),
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{}),
	)
	if err := ledgerv1.RegisterLedgerServiceHandler(context.Background(), gw, conn); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+OpenAPIPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.JSON)
	})
	mux.Handle("/v1/", gw)
	return mux, nil
}

// errorHandler writes the gRPC status as JSON (code, message and details,
// the ErrorInfo among them), with the HTTP status of its code; the
// ledger's conflicts (FAILED_PRECONDITION) are 409.
func errorHandler(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if status.Code(err) == codes.FailedPrecondition {
		err = &runtime.HTTPStatusError{HTTPStatus: http.StatusConflict, Err: err}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}
