package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/redistest"
)

// logLine is one JSON log line with its keys in the order written.
type logLine struct {
	keys   []string
	fields map[string]any
}

// finishedCalls parses the "finished call" lines of logs.
func finishedCalls(t *testing.T, logs string) []logLine {
	t.Helper()
	var out []logLine
	for _, raw := range strings.Split(strings.TrimSpace(logs), "\n") {
		if raw == "" {
			continue
		}
		l := logLine{fields: map[string]any{}}
		if err := json.Unmarshal([]byte(raw), &l.fields); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		if l.fields["msg"] != "finished call" {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(raw))
		if _, err := dec.Token(); err != nil { // {
			t.Fatal(err)
		}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				t.Fatal(err)
			}
			l.keys = append(l.keys, k.(string))
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, l)
	}
	return out
}

// TestCallLogLine: each finished call writes one line with the gRPC
// fields, the ledger's fields in the order the call added them, and its
// code and duration, at the level its code maps to.
func TestCallLogLine(t *testing.T) {
	e := startEnv(t, redistest.Start(t).Client(t))
	id := e.id("refund")
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	r, err := e.c.Reserve(ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 1250, "card": "4111-SECRET"}), newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	if r.GetDecision() != ledgerv1.Decision_DECISION_EXECUTE {
		t.Fatalf("decision %v", r.GetDecision())
	}
	_, err = e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 9999, "card": "5500-SECRET"}), newHolder()))
	if c, ei, _ := errorInfo(t, err); c != codes.FailedPrecondition || ei.GetReason() != "IDEMPOTENCY_KEY_REUSED" {
		t.Fatalf("changed params: %v", err)
	}
	if _, err := healthpb.NewHealthClient(e.conn).Check(e.ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}

	lines := finishedCalls(t, e.logs.String())
	if len(lines) != 3 {
		t.Fatalf("%d finished-call lines, want 3:\n%s", len(lines), e.logs.String())
	}
	first, reused, health := lines[0], lines[1], lines[2]
	wantKeys := []string{"time", "level", "msg", "protocol", "grpc.component", "grpc.service", "grpc.method", "grpc.method_type",
		"peer.address", "grpc.start_time", "grpc.request.deadline",
		"ledger.operation_id", "ledger.tool", "ledger.run_id", "ledger.state", "ledger.attempt", "ledger.fingerprint", "ledger.decision",
		"grpc.code", "grpc.time_ms"}
	if strings.Join(first.keys, " ") != strings.Join(wantKeys, " ") {
		t.Fatalf("keys of a new Reserve's line:\n got %v\nwant %v", first.keys, wantKeys)
	}
	for k, want := range map[string]any{
		"level": "INFO", "protocol": "grpc", "grpc.component": "server", "grpc.service": "ledger.v1.LedgerService",
		"grpc.method": "Reserve", "grpc.method_type": "unary", "ledger.operation_id": id, "ledger.tool": "payments.refund",
		"ledger.state": "RUNNING", "ledger.attempt": 1.0, "ledger.decision": "EXECUTE", "grpc.code": "OK",
	} {
		if first.fields[k] != want {
			t.Errorf("%s = %v, want %v", k, first.fields[k], want)
		}
	}
	if fp, _ := first.fields["ledger.fingerprint"].(string); !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(fp) {
		t.Errorf("ledger.fingerprint %q: want 16 hex digits", fp)
	}
	if ms, err := strconv.ParseFloat(first.fields["grpc.time_ms"].(string), 64); err != nil || ms <= 0 {
		t.Errorf("grpc.time_ms %v", first.fields["grpc.time_ms"])
	}
	if _, err := time.Parse(time.RFC3339, first.fields["grpc.start_time"].(string)); err != nil {
		t.Errorf("grpc.start_time: %v", err)
	}
	// A number could appear in a time or an address by chance: the cards
	// stand for every parameter.
	if strings.Contains(e.logs.String(), "4111-SECRET") || strings.Contains(e.logs.String(), "5500-SECRET") {
		t.Fatal("a parameter reached the log")
	}

	for k, want := range map[string]any{"level": "WARN", "grpc.code": "FailedPrecondition", "ledger.reason": "IDEMPOTENCY_KEY_REUSED", "ledger.operation_id": id} {
		if reused.fields[k] != want {
			t.Errorf("reused key's line: %s = %v, want %v", k, reused.fields[k], want)
		}
	}
	if _, ok := reused.fields["grpc.error"]; !ok {
		t.Error("reused key's line has no grpc.error")
	}
	if _, ok := reused.fields["grpc.request.deadline"]; ok {
		t.Error("a call without a deadline logs grpc.request.deadline")
	}
	if health.fields["grpc.service"] != "grpc.health.v1.Health" || health.fields["grpc.method"] != "Check" || health.fields["level"] != "INFO" {
		t.Errorf("health Check's line: %v", health.fields)
	}
}

// TestCallLogLevel: below the logger's level a call writes nothing; at or
// above it, the whole line with the ledger's fields.
func TestCallLogLevel(t *testing.T) {
	e := startEnvLogging(t, redistest.Start(t).Client(t), slog.LevelWarn)
	id := e.id("refund")
	if _, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 1}), newHolder())); err != nil {
		t.Fatal(err)
	}
	if lines := finishedCalls(t, e.logs.String()); len(lines) != 0 {
		t.Fatalf("an OK call at --log-level warn wrote %d lines:\n%s", len(lines), e.logs.String())
	}
	_, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 2}), newHolder()))
	if c, _, _ := errorInfo(t, err); c != codes.FailedPrecondition {
		t.Fatalf("changed params: %v", err)
	}
	lines := finishedCalls(t, e.logs.String())
	if len(lines) != 1 {
		t.Fatalf("%d lines, want the refused call's:\n%s", len(lines), e.logs.String())
	}
	if l := lines[0].fields; l["level"] != "WARN" || l["ledger.operation_id"] != id || l["ledger.reason"] != "IDEMPOTENCY_KEY_REUSED" {
		t.Fatalf("the refused call's line: %v", l)
	}
}

// TestCallLogBoundsInvalidValues: the ids of a request are logged before
// the ledger validates them, so one over its size limit is cut to the limit
// in the call's line (and the call refused): a request cannot write
// kilobytes of its own into the log.
func TestCallLogBoundsInvalidValues(t *testing.T) {
	e := startEnv(t, redistest.Shared(t).Client(t))
	huge := strings.Repeat("é", 50<<10) // 100 KiB, two bytes a character
	for _, req := range []*ledgerv1.ReserveRequest{
		{OperationId: e.id("x") + huge, Tool: "payments.refund", Holder: newHolder()},
		{OperationId: e.id("x"), Tool: "payments.refund" + huge, Holder: newHolder()},
		{OperationId: e.id("x"), Tool: "payments.refund", RunId: huge, Holder: newHolder()},
	} {
		_, err := e.c.Reserve(e.ctx, req)
		if c, ei, _ := errorInfo(t, err); c != codes.InvalidArgument || ei.GetReason() != "INVALID_ARGUMENT" {
			t.Fatalf("oversized id: %v", err)
		}
	}
	if _, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: huge}); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("Lookup of an oversized id: %v", err)
	}
	lines := finishedCalls(t, e.logs.String())
	if len(lines) != 4 {
		t.Fatalf("%d finished-call lines, want 4:\n%s", len(lines), e.logs.String())
	}
	for _, l := range lines {
		for k, max := range map[string]int{"ledger.operation_id": 256, "ledger.tool": 128, "ledger.run_id": 256} {
			v, _ := l.fields[k].(string)
			if len(v) > max+len("...(truncated)") {
				t.Errorf("%s of %d bytes in the log", k, len(v))
			}
		}
	}
	if n := len(e.logs.String()); n > 16<<10 {
		t.Fatalf("4 refused calls wrote %d bytes of log", n)
	}
}

// TestCallLogKeepsParamsOut: a refused request's parameters stay out of the
// log, their member names too (a caller may key parameters by data, such as
// an e-mail address): the caller's error names the place of the bad value,
// the log line only the request fields that were refused.
func TestCallLogKeepsParamsOut(t *testing.T) {
	e := startEnv(t, redistest.Shared(t).Client(t))
	params := &structpb.Struct{Fields: map[string]*structpb.Value{
		"alice@example.com": structpb.NewNumberValue(math.Inf(1)),
	}}
	_, err := e.c.Reserve(e.ctx, reserveReq(e.id("x"), "payments.refund", params, newHolder()))
	c, ei, _ := errorInfo(t, err)
	if c != codes.InvalidArgument || ei.GetReason() != "INVALID_ARGUMENT" || !strings.Contains(status.Convert(err).Message(), "alice@example.com") {
		t.Fatalf("Reserve with a bad parameter: %v; want INVALID_ARGUMENT naming its place", err)
	}
	lines := finishedCalls(t, e.logs.String())
	if len(lines) != 1 {
		t.Fatalf("%d finished-call lines, want 1:\n%s", len(lines), e.logs.String())
	}
	if strings.Contains(e.logs.String(), "alice@example.com") {
		t.Fatalf("a parameter's name reached the log:\n%s", e.logs.String())
	}
	if got, _ := lines[0].fields["grpc.error"].(string); !strings.Contains(got, "params") {
		t.Errorf("grpc.error %q: want the refused field named", got)
	}
	if lines[0].fields["ledger.reason"] != "INVALID_ARGUMENT" {
		t.Errorf("ledger.reason %v", lines[0].fields["ledger.reason"])
	}
}

// TestCallLogSaysWhyTheStoreRefused: a call the store refuses (here Redis
// at maxmemory with noeviction) logs the store's reason, never the
// parameters.
func TestCallLogSaysWhyTheStoreRefused(t *testing.T) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	e := startEnv(t, srv.Client(t))
	if err := e.rdb.ConfigSet(e.ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	params := mustStruct(t, map[string]any{"card": "4111-SECRET"})
	_, err := e.c.Reserve(e.ctx, reserveReq(e.id("oom"), "payments.refund", params, newHolder()))
	if c, ei, _ := errorInfo(t, err); c != codes.Unavailable || ei.GetReason() != "STORE_UNAVAILABLE" {
		t.Fatalf("Reserve on a full store = %v", err)
	}
	lines := finishedCalls(t, e.logs.String())
	if len(lines) != 1 {
		t.Fatalf("%d finished-call lines, want 1:\n%s", len(lines), e.logs.String())
	}
	if got, _ := lines[0].fields["ledger.store_error"].(string); !strings.Contains(got, "OOM") {
		t.Errorf("ledger.store_error %q: want the store's OOM reason", got)
	}
	if strings.Contains(e.logs.String(), "SECRET") {
		t.Fatalf("a parameter reached the log:\n%s", e.logs.String())
	}
}
