package server

import (
	"context"
	"log/slog"
	"testing"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// TestCodeLevel: every code logs at the level go-grpc-middleware's logging
// interceptor gives it, so alerts on log levels keep their meaning.
func TestCodeLevel(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated+1; c++ {
		if got, want := codeLevel(c), slog.Level(logging.DefaultServerCodeToLevel(c)); got != want {
			t.Errorf("%v: level %v, want %v", c, got, want)
		}
	}
}

func TestStreamType(t *testing.T) {
	for _, c := range []struct {
		info grpc.StreamServerInfo
		want string
	}{
		{grpc.StreamServerInfo{IsClientStream: true, IsServerStream: true}, "bidi_stream"},
		{grpc.StreamServerInfo{IsClientStream: true}, "client_stream"},
		{grpc.StreamServerInfo{IsServerStream: true}, "server_stream"},
	} {
		if got := streamType(&c.info); got != c.want {
			t.Errorf("%+v: %q, want %q", c.info, got, c.want)
		}
	}
}

// TestAddLog: fields keep the order they were added in, a key added again
// replaces its value, and outside a call nothing happens.
func TestAddLog(t *testing.T) {
	addLog(context.Background(), slog.String("ledger.tool", "x")) // no call: no panic, nothing kept
	cl := new(callLog)
	ctx := context.WithValue(context.Background(), callLogKey{}, cl)
	addLog(ctx, slog.String("a", "1"), slog.String("b", "2"))
	addLog(ctx, slog.String("a", "3"), slog.Int("c", 4))
	var got []string
	for _, a := range cl.attrs {
		got = append(got, a.String())
	}
	if want := "[a=3 b=2 c=4]"; slog.AnyValue(got).String() != want {
		t.Fatalf("fields %v, want %s", got, want)
	}
}
