package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
)

// lockedBuffer is a log destination the server's goroutines write while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Calls refused for missing or bad credentials write at most one call log
// line every refusalLogEvery, through the logger the server is given: each
// line counts the refused calls since the previous one that wrote none, and
// quotes no key material. Authenticated calls log as before, one line each.
func TestRefusedCallsLoggedAtMostEveryInterval(t *testing.T) {
	key, hash, err := NewAPIKey("log-agent")
	if err != nil {
		t.Fatal(err)
	}
	revoked, revokedHash, err := NewAPIKey("log-revoked")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := ParseCredentials([]byte(fmt.Sprintf("keys:\n"+
		"  - {id: log-agent, tenant: acme, scopes: [agent], secret_sha256: %s}\n"+
		"  - {id: log-revoked, tenant: acme, scopes: [agent], secret_sha256: %s, disabled: true}\n", hash, revokedHash)))
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	l, err := ledger.New(redistest.Shared(t).Client(t), ledger.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(Config{Ledger: l, Logger: log, Auth: NewAuthenticator(creds)})
	var at atomic.Int64 // the refusals' clock, in nanoseconds from start
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	svc.authRefusals.now = func() time.Time { return start.Add(time.Duration(at.Load())) }
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c := ledgerv1.NewLedgerServiceClient(conn)

	_, revokedSecret, _ := strings.Cut(revoked, ".")
	_, keySecret, _ := strings.Cut(key, ".")
	wrongSecret := strings.Repeat("e", 64)
	headers := []string{
		"Bearer " + revoked,                // revoked: the first, logged
		"",                                 // no credentials
		"Bearer log-agent." + wrongSecret,  // a wrong secret
		"Bearer unknown-id." + wrongSecret, // an unknown id
		"Basic " + keySecret,               // not a bearer key
		"Bearer " + strings.ReplaceAll(key, ".", ""), // the key without its '.'
	}
	refused := func(header string) {
		t.Helper()
		ctx := context.Background()
		if header != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", header)
		}
		_, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: "refused-log"})
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Lookup with %q: %v, want UNAUTHENTICATED", header, err)
		}
	}
	const calls = 60
	for i := range calls {
		refused(headers[i%len(headers)])
	}
	// A refused stream (reflection needs credentials) counts with them.
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Send may see io.EOF when the server has already refused the stream;
	// Recv then returns the refusal.
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if _, err := rs.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("reflection without credentials: %v, want UNAUTHENTICATED", err)
	}
	// Authenticated calls are not held back.
	for range 3 {
		_, err := c.Lookup(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key),
			&ledgerv1.LookupRequest{OperationId: "refused-log-" + hex.EncodeToString([]byte(t.Name()))})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("Lookup with a valid key: %v, want NOT_FOUND", err)
		}
	}
	at.Store(int64(refusalLogEvery - time.Millisecond))
	refused("Bearer " + revoked)
	at.Store(int64(refusalLogEvery))
	refused("Basic " + keySecret) // logged, with the count since the first
	at.Store(int64(refusalLogEvery + time.Second))
	refused("")

	var unauth, notFound []map[string]any
	out := logs.String()
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec["msg"] != "finished call" {
			continue
		}
		switch rec["grpc.code"] {
		case "Unauthenticated":
			unauth = append(unauth, rec)
		case "NotFound":
			notFound = append(notFound, rec)
		}
	}
	if len(notFound) != 3 {
		t.Errorf("%d call log lines of authenticated calls, want 3 (one each)", len(notFound))
	}
	var counts []any
	for _, rec := range unauth {
		counts = append(counts, rec["ledger.unlogged_refusals"])
	}
	// 60 + 1 stream + 1 refused calls before the second line: 61 without
	// a line of their own; then the last call, within the interval.
	if len(unauth) != 2 || counts[0] != float64(0) || counts[1] != float64(calls+1) {
		t.Errorf("%d call log lines of refused calls with unlogged counts %v, want 2 with [0 %d] (one per %s)",
			len(unauth), counts, calls+1, refusalLogEvery)
	}
	sum := sha256.Sum256([]byte(revokedSecret))
	keySum := sha256.Sum256([]byte(keySecret))
	for _, s := range []string{revokedSecret, keySecret, wrongSecret, hex.EncodeToString(sum[:]), hex.EncodeToString(keySum[:]),
		strings.ReplaceAll(key, ".", "")} {
		if strings.Contains(out, s) {
			t.Errorf("the log holds key material %q:\n%s", s, out)
		}
	}
}
