package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/opledger/ledger/console"
	"github.com/opledger/ledger/httpapi"
	"github.com/opledger/ledger/receipt"
	"github.com/opledger/ledger/server"
)

// maxHTTPBody bounds an HTTP request body: the largest request message,
// as JSON, with room for its encoding.
const maxHTTPBody = 4 * server.DefaultMaxRequestBytes

// httpAPI is the HTTP/JSON listener: grpc-gateway in front of the service,
// which it reaches over an in-process connection served like any other,
// and the operator console under /console/.
type httpAPI struct {
	lis  net.Listener
	srv  *http.Server
	pipe *bufconn.Listener
	conn *grpc.ClientConn
}

// httpOptions are the HTTP listener's settings.
type httpOptions struct {
	receipts    *receipt.Signer // nil: no JWK Set served
	tls         *tls.Config     // nil: plaintext
	anonymous   bool            // the service has no credentials
	readTimeout time.Duration   // bounds reading one request, its body included
	idleTimeout time.Duration   // how long a connection with no request stays open
}

// newHTTPAPI builds the API, which serve serves on lis in front of a
// service.
func newHTTPAPI(lis net.Listener, o httpOptions, log *slog.Logger) (*httpAPI, error) {
	a := &httpAPI{lis: lis, pipe: bufconn.Listen(1 << 20)}
	// The in-process connection carries TLS when the service does (its
	// credentials are the server's, for every listener); nothing can sit
	// between its ends, so the certificate needs no verification there.
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})
	}
	var err error
	a.conn, err = grpc.NewClient("passthrough:///ledgerd",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return a.pipe.DialContext(ctx) }),
		grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	h, err := httpapi.Handler(a.conn)
	if err != nil {
		_ = a.conn.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(console.Path, console.Handler())
	if o.receipts != nil {
		mux.Handle("GET "+receipt.JWKSPath, o.receipts.JWKSHandler())
	}
	mux.Handle("/", h)
	limited := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxHTTPBody)
		mux.ServeHTTP(w, r)
	})
	// A body sent slowly holds its connection until ReadTimeout: it is read
	// before the service sees the call's credentials.
	a.srv = &http.Server{Handler: httpapi.Protect(limited, o.anonymous), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: o.readTimeout,
		IdleTimeout: o.idleTimeout, TLSConfig: o.tls, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	return a, nil
}

// serve serves the API until ctx ends, then shuts it down within timeout.
func (a *httpAPI) serve(ctx context.Context, svc *server.Service, timeout time.Duration, log *slog.Logger) error {
	go func() { _ = svc.Serve(a.pipe) }()
	log.Info("HTTP API serving", "listen", a.lis.Addr().String(), "tls", a.srv.TLSConfig != nil)
	done := make(chan error, 1)
	// Its connections count towards --max-connections with the gRPC
	// listener's, from their accept (before TLS and credentials).
	lis := svc.CountConnections(a.lis)
	go func() {
		var err error
		if a.srv.TLSConfig != nil {
			err = a.srv.ServeTLS(lis, "", "")
		} else {
			err = a.srv.Serve(lis)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := a.srv.Shutdown(sctx)
	_ = a.conn.Close()
	return err
}
