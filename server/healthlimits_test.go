package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/internal/h2test"
	"github.com/opledger/ledger/server"
)

// serveLoopback serves svc on a free loopback port until the test ends and
// returns its address.
func serveLoopback(t *testing.T, svc *server.Service) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)
	return lis.Addr().String()
}

// dialConn returns a gRPC connection of its own to addr, closed when the
// test ends.
func dialConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// watch opens a health Watch on conn and returns the function that ends
// the stream, and its first answer's error (nil once the server has sent
// the first status, SERVING).
func watch(t *testing.T, conn *grpc.ClientConn) (context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return cancel, err
	}
	resp, err := w.Recv()
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("first status %v, want SERVING", resp.GetStatus())
	}
	return cancel, err
}

// The health Watch streams held at once are bounded across the whole server
// (every connection together): the one over the bound is refused at once
// with RESOURCE_EXHAUSTED, counted, and held nowhere; Check is served
// meanwhile; once a stream ends a new Watch is served again.
func TestMaxHealthWatchesRefusesTheNextWatch(t *testing.T) {
	t.Parallel()
	const limit = 3
	addr, svc := startLimitedService(t, server.ConnectionLimits{MaxHealthWatches: limit})
	conns := []*grpc.ClientConn{dialConn(t, addr), dialConn(t, addr)}
	cancels := make([]context.CancelFunc, limit)
	for i := range limit {
		var err error
		if cancels[i], err = watch(t, conns[i%2]); err != nil {
			t.Fatalf("watch %d of %d: %v", i+1, limit, err)
		}
	}
	if got := svc.HealthWatches(); got.Open != limit || got.Refused != 0 {
		t.Fatalf("%+v, want %d open and none refused", got, limit)
	}

	// The deadline only catches a Watch the server held: a refused one
	// ends long before it.
	_, err := watch(t, dialConn(t, addr))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "health Watch") {
		t.Fatalf("watch %d: %v, want RESOURCE_EXHAUSTED saying why", limit+1, err)
	}
	if got := svc.HealthWatches(); got.Open != limit || got.Refused != 1 {
		t.Errorf("after the refusal: %+v, want %d open and 1 refused", got, limit)
	}

	for i, conn := range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Check on connection %d with the watches at their bound: %v, %v; want SERVING", i+1, resp, err)
		}
	}

	cancels[0]()
	waitFor(t, 15*time.Second, "the ended watch released", func() bool { return svc.HealthWatches().Open < limit })
	if _, err := watch(t, conns[0]); err != nil {
		t.Fatalf("watch after one ended: %v", err)
	}
	if got := svc.HealthWatches(); got.Open != limit || got.Refused != 1 {
		t.Errorf("at the end: %+v, want %d open and 1 refused", got, limit)
	}
}

// realMetadata is what a call may carry besides gRPC's own headers: an API
// key, W3C trace context with the longest tracestate, and a baggage of
// 8 KiB (the most W3C Baggage asks platforms to propagate).
func realMetadata() metadata.MD {
	return metadata.Pairs(
		"authorization", "Bearer "+strings.Repeat("k", 64)+"."+strings.Repeat("f", 64),
		"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate", strings.Repeat("v", 512),
		"baggage", strings.Repeat("b", 8192),
		"user-agent", "agent/1.0 grpc-go/1.85.0",
	)
}

// rawCheck sends a health Check on a connection of its own to addr by hand,
// with the extra header fields, and returns whether the server answered it
// (HEADERS on its stream) or refused it (RST_STREAM on the stream, or
// GOAWAY). The fields are sent whatever the server's
// SETTINGS_MAX_HEADER_LIST_SIZE, which a gRPC client would honour itself.
func rawCheck(t *testing.T, addr string, extra ...hpack.HeaderField) (answered bool) {
	t.Helper()
	conn, err := h2test.Open(addr, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/grpc.health.v1.Health/Check"}, {Name: ":authority", Value: addr},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		if err := enc.WriteField(f); err != nil {
			t.Fatal(err)
		}
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer to the stream: %v", err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			if f.StreamID == 1 {
				return true
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return false
			}
		case *http2.GoAwayFrame:
			return false
		}
	}
}

// The header list of a call is bounded (MaxHeaderListSize, far below
// grpc-go's 16 MB): a call with real metadata (an API key, trace context,
// a large baggage) is served; one whose header fields add up to more is
// refused, by a gRPC client before it sends them (the server advertises
// the bound) and by the server when a peer sends them anyway.
func TestMaxHeaderListSize(t *testing.T) {
	t.Parallel()
	addr := startLimited(t, server.ConnectionLimits{})
	hc := healthpb.NewHealthClient(dialConn(t, addr))
	ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), realMetadata()), 30*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check with real metadata: %v", err)
	}

	// Fields of 1 KiB each, up to 2 KiB over the bound (each field counts
	// its name, its value and 32 bytes).
	field := hpack.HeaderField{Name: "x-pad", Value: strings.Repeat("p", 1024)}
	n := (server.MaxHeaderListSize+2048)/int(field.Size()) + 1
	over := make([]hpack.HeaderField, n)
	md := metadata.MD{}
	for i := range over {
		over[i] = field
		md.Append(field.Name, field.Value)
	}
	ctx, cancel = context.WithTimeout(metadata.NewOutgoingContext(context.Background(), md), 30*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Errorf("Check with %d bytes of headers was served, want refused", n*int(field.Size()))
	} else if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded {
		t.Errorf("Check with %d bytes of headers: %v, want refused at once", n*int(field.Size()), err)
	}

	if !rawCheck(t, addr) {
		t.Fatal("a raw Check with gRPC's own headers was refused")
	}
	if rawCheck(t, addr, over...) {
		t.Errorf("a raw Check with %d bytes of headers was answered, want RST_STREAM or GOAWAY", n*int(field.Size()))
	}
	if !rawCheck(t, addr, field) {
		t.Error("a raw Check with one 1 KiB header was refused")
	}
}
