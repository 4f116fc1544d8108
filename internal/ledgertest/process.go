package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
)

// FreeAddr returns a loopback host:port that was free a moment ago, for a
// ledgerd process (or its metrics listener) to bind.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// WaitServing waits until the ledger service at addr (plaintext) reports
// SERVING on grpc.health.v1, for at most timeout. It gives up at once when
// exited is closed (the process ended; nil: never). exited is closed rather
// than sent on, so that the caller can still wait for it after WaitServing
// has seen it.
func WaitServing(addr string, exited <-chan struct{}, timeout time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	health := grpc_health_v1.NewHealthClient(conn)
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-exited:
			return errors.New("exited before it reported SERVING")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := health.Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: "ledger.v1.LedgerService"})
		cancel()
		if err == nil && r.GetStatus() == grpc_health_v1.HealthCheckResponse_SERVING {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("no SERVING within %s", timeout), err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}
