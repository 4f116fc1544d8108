package metrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
	"github.com/opledger/ledger/server"
)

func TestMain(m *testing.M) { redistest.Main(m) }

type stack struct {
	m   *metrics.Metrics
	c   *client.Client
	srv *httptest.Server
}

func start(t *testing.T, rdb redis.UniversalClient, o metrics.Options, extra ...grpc.ServerOption) *stack {
	t.Helper()
	m := metrics.New(o)
	pol, err := ledger.ParsePolicies([]byte(ledgertest.Policy))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := ledger.New(rdb, ledger.Options{Policies: pol, Observer: m.Observe, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := server.New(server.Config{Ledger: l, Logger: log}, append(m.ServerOptions(), extra...)...)
	m.InitializeRPC(svc.GRPC)
	m.WatchStore(l, time.Millisecond)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = svc.Serve(lis) }()
	t.Cleanup(svc.GRPC.Stop)
	c, err := client.Dial(lis.Addr().String(), client.WithBackoff(client.Backoff{Base: time.Millisecond, Max: 10 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	hs := httptest.NewServer(m.Handler())
	t.Cleanup(hs.Close)
	return &stack{m: m, c: c, srv: hs}
}

// scrape returns the metrics text and a lookup of sample values by
// "name{label=value,...}" (labels sorted as exposed).
func (s *stack) scrape(t *testing.T) (string, func(name string, labels map[string]string) float64) {
	t.Helper()
	resp, err := s.srv.Client().Get(s.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("unparsable metrics: %v", err)
	}
	return string(body), func(name string, labels map[string]string) float64 {
		f, ok := families[name]
		if !ok {
			return 0
		}
		var sum float64
	metric:
		for _, mt := range f.GetMetric() {
			got := map[string]string{}
			for _, lp := range mt.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue metric
				}
			}
			switch {
			case mt.Counter != nil:
				sum += mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				sum += mt.GetGauge().GetValue()
			case mt.Histogram != nil:
				sum += float64(mt.GetHistogram().GetSampleCount())
			}
		}
		return sum
	}
}

func TestLedgerMetrics(t *testing.T) {
	s := start(t, redistest.Shared(t).Client(t), metrics.Options{})
	ctx := context.Background()
	id := "metrics-" + client.NewHolder()
	ok := func(context.Context, client.Attempt) (client.Result, error) {
		return client.Result{ResourceID: "r"}, nil
	}
	// Executed, then replayed.
	if _, err := s.c.Do(ctx, client.Op{ID: id + "-a", Tool: "payments.refund", Params: map[string]any{"amount": 1}}, ok); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Do(ctx, client.Op{ID: id + "-a", Tool: "payments.refund", Params: map[string]any{"amount": 1}}, ok); err != nil {
		t.Fatal(err)
	}
	// A conflict.
	if _, err := s.c.Do(ctx, client.Op{ID: id + "-a", Tool: "payments.refund", Params: map[string]any{"amount": 2}}, ok); err == nil {
		t.Fatal("no conflict")
	}
	// A stale token.
	r, err := s.c.Reserve(ctx, client.Op{ID: id + "-b", Tool: "payments.refund"}, client.NewHolder())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = s.c.Complete(ctx, id+"-b", r.Operation.FencingToken-1, client.Result{})
	// UNKNOWN, escalated, then reconciled as applied.
	if _, err := s.c.MarkUnknown(ctx, id+"-b", r.Operation.FencingToken, "timeout"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Reconcile(ctx, id+"-b", client.Finding{Kind: client.Escalate}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Reconcile(ctx, id+"-b", client.Finding{Kind: client.Applied}); err != nil {
		t.Fatal(err)
	}
	// Its repeat (a reconciler retrying after a lost answer) is answered OK
	// and records nothing: no second finding is counted.
	if _, err := s.c.Reconcile(ctx, id+"-b", client.Finding{Kind: client.Applied}); err != nil {
		t.Fatal(err)
	}
	text, v := s.scrape(t)
	tool := map[string]string{"tool": "payments.refund"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{"tool": "payments.refund"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ledger_decisions_total", with("decision", "execute"), 2},
		{"ledger_decisions_total", with("decision", "replay"), 1},
		{"ledger_conflicts_total", with("differs", "params"), 1},
		{"ledger_refusals_total", map[string]string{"op": "Complete", "reason": "STALE_FENCING_TOKEN"}, 1},
		{"ledger_transitions_total", with("from", "RUNNING", "to", "UNKNOWN", "reason", "MARKED_UNKNOWN"), 1},
		{"ledger_transitions_total", with("from", "UNKNOWN", "to", "SUCCEEDED", "reason", "RECONCILED_APPLIED"), 1},
		{"ledger_operations_finished_total", with("state", "SUCCEEDED"), 2},
		{"ledger_escalations_total", tool, 1},
		{"ledger_reconciliations_total", with("finding", "escalate"), 1},
		{"ledger_reconciliations_total", with("finding", "applied"), 1},
		{"ledger_attempts_per_operation", with("state", "SUCCEEDED"), 2},
		{"ledger_state_duration_seconds", with("state", "RUNNING"), 2},
		{"ledger_state_duration_seconds", with("state", "UNKNOWN"), 1},
		{"ledger_script_duration_seconds", map[string]string{"op": "Reserve"}, 4},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Reserve", "grpc_code": "OK"}, 3},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Reserve", "grpc_code": "FailedPrecondition"}, 1},
	} {
		if got := v(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if strings.Contains(text, id) || strings.Contains(text, "tenant=") {
		t.Fatal("an operation id or a tenant reached the metrics")
	}
}

func TestTenantLabelWhenConfigured(t *testing.T) {
	s := start(t, redistest.Shared(t).Client(t), metrics.Options{TenantLabel: true})
	if _, err := s.c.Do(context.Background(), client.Op{ID: "tenant-" + client.NewHolder(), Tool: "x.y"}, func(context.Context, client.Attempt) (client.Result, error) {
		return client.Result{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	_, v := s.scrape(t)
	if v("ledger_decisions_total", map[string]string{"tenant": "default", "tool": "x.y", "decision": "execute"}) != 1 {
		t.Fatal("no tenant label")
	}
}

// TestOverdueAlertRisesAndFalls is the alert's test: an UNKNOWN operation
// past its recovery window raises ledger_unresolved_overdue, which the rule
// in docs/alerts.yml fires on; reconciling it brings the gauge back to 0. An
// UNKNOWN operation within its window (an hour, so that no slow machine can
// pass it) counts in ledger_unresolved_operations but never as overdue.
func TestOverdueAlertRisesAndFalls(t *testing.T) {
	redistest.EachBackend(t, func(t *testing.T, rdb redis.UniversalClient) {
		s := start(t, rdb, metrics.Options{})
		ctx := context.Background()
		unknown := func(tool string) string {
			t.Helper()
			id := "overdue-" + client.NewHolder()
			r, err := s.c.Reserve(ctx, client.Op{ID: id, Tool: tool}, client.NewHolder())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.c.MarkUnknown(ctx, id, r.Operation.FencingToken, "timeout"); err != nil {
				t.Fatal(err)
			}
			return id
		}
		within := map[string]string{"tool": "patient.refund", "effect": "IRREVERSIBLE", "state": "UNKNOWN"}
		unknown("patient.refund")
		id := unknown("slow.refund")
		labels := map[string]string{"tool": "slow.refund", "effect": "IRREVERSIBLE", "state": "UNKNOWN"}
		_, v := s.scrape(t)
		for _, tool := range []string{"slow.refund", "patient.refund"} {
			if got := v("ledger_unresolved_operations", map[string]string{"tool": tool, "state": "UNKNOWN"}); got < 1 {
				t.Fatalf("unresolved UNKNOWN of %s = %v", tool, got)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, v = s.scrape(t)
			if got := v("ledger_unresolved_overdue", within); got != 0 {
				t.Fatalf("overdue within the window = %v", got)
			}
			if v("ledger_unresolved_overdue", labels) >= 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the overdue gauge never rose")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := s.c.Reconcile(ctx, id, client.Finding{Kind: client.NotApplied}); err != nil {
			t.Fatal(err)
		}
		text, v := s.scrape(t)
		if got := v("ledger_unresolved_overdue", labels); got != 0 || !strings.Contains(text, "ledger_unresolved_overdue{") {
			t.Fatalf("overdue after reconciliation = %v (the series must read 0, not vanish)", got)
		}
		if got := v("ledger_unresolved_overdue", within); got != 0 {
			t.Fatalf("overdue within the window = %v", got)
		}
	})
}

// TestLiveCountDriftShows: a live count below zero (the counts drifted from
// the records, e.g. after a restore of the store) shows in
// ledger_unresolved_operations as the negative number it is, and in
// ledger_live_counts_negative also where another shard's operations offset
// it in the sum.
func TestLiveCountDriftShows(t *testing.T) {
	rdb := redistest.Start(t).Client(t)
	s := start(t, rdb, metrics.Options{})
	ctx := context.Background()
	const tool = "drift.refund"
	// One RUNNING operation, counted in its shard.
	if _, err := s.c.Reserve(ctx, client.Op{ID: "drift-1", Tool: tool}, client.NewHolder()); err != nil {
		t.Fatal(err)
	}
	field := func(state int) string { return fmt.Sprintf("%s|%d|default", tool, state) }
	shard := -1
	for n := range ledger.NumShards {
		if rdb.HExists(ctx, statsKey(n), field(2)).Val() {
			shard = n
		}
	}
	if shard < 0 {
		t.Fatal("the RUNNING operation is counted in no shard")
	}
	other := (shard + 1) % ledger.NumShards
	// The drift: three PENDING operations fewer than the records, and one
	// RUNNING fewer in another shard than the RUNNING one's.
	if err := rdb.HIncrBy(ctx, statsKey(shard), field(1), -3).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HIncrBy(ctx, statsKey(other), field(2), -1).Err(); err != nil {
		t.Fatal(err)
	}
	_, v := s.scrape(t)
	labels := func(state string) map[string]string { return map[string]string{"tool": tool, "state": state} }
	for _, c := range []struct {
		name, state string
		want        float64
	}{
		{"ledger_unresolved_operations", "PENDING", -3},
		{"ledger_live_counts_negative", "PENDING", -3},
		{"ledger_unresolved_operations", "RUNNING", 0},
		{"ledger_live_counts_negative", "RUNNING", -1},
	} {
		if got := v(c.name, labels(c.state)); got != c.want {
			t.Errorf("%s{state=%q} = %v, want %v", c.name, c.state, got, c.want)
		}
	}
	// Repaired, the drift gauge reads 0.
	if err := rdb.HDel(ctx, statsKey(shard), field(1)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HDel(ctx, statsKey(other), field(2)).Err(); err != nil {
		t.Fatal(err)
	}
	text, v := s.scrape(t)
	if got := v("ledger_live_counts_negative", labels("PENDING")); got != 0 || !strings.Contains(text, "ledger_live_counts_negative{") {
		t.Errorf("ledger_live_counts_negative after the repair = %v (the series must read 0, not vanish)", got)
	}
	if got := v("ledger_unresolved_operations", labels("RUNNING")); got != 1 {
		t.Errorf("ledger_unresolved_operations{state=RUNNING} after the repair = %v, want 1", got)
	}
}

// statsKey is the key of a shard's live counts (docs/design.md §2).
func statsKey(shard int) string {
	return fmt.Sprintf("%s:{s%02d}:stats", ledger.DefaultPrefix, shard)
}

func TestAlertRulesFile(t *testing.T) {
	raw, err := os.ReadFile("../docs/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert       string
				Expr        string
				For         string
				Labels      map[string]string
				Annotations map[string]string
			}
		}
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&rules); err != nil {
		t.Fatal(err)
	}
	// Every metric a rule names is one the service exports: TestDocsMatchMetrics.
	seen := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			seen++
			if r.Alert == "" || r.Expr == "" || r.Annotations["summary"] == "" || r.Annotations["runbook"] == "" {
				t.Errorf("rule %+v is incomplete", r)
			}
		}
	}
	if seen == 0 || rules.Groups[0].Rules[0].Alert != "LedgerOperationUnresolvedPastRecoveryWindow" {
		t.Fatal("the first rule must be the unresolved-past-recovery-window alert")
	}
}

func TestTracesLinkTheCallersTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prop := propagation.TraceContext{}
	s := start(t, redistest.Shared(t).Client(t), metrics.Options{},
		grpc.StatsHandler(otelgrpc.NewServerHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))
	_ = s
	// A caller with its own trace.
	caller := sdktrace.NewTracerProvider()
	ctx, span := caller.Tracer("agent").Start(context.Background(), "agent step")
	conn, err := grpc.NewClient(strings.TrimPrefix(s.c.Conn().Target(), "passthrough:///"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(caller), otelgrpc.WithPropagators(prop))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	id := "trace-" + client.NewHolder()
	if _, err := ledgerv1.NewLedgerServiceClient(conn).Reserve(ctx, &ledgerv1.ReserveRequest{OperationId: id, Tool: "t.x", Holder: "h", RunId: "run-9"}); err != nil {
		t.Fatal(err)
	}
	span.End()
	// The server ends its span after the reply is sent, so the caller may
	// have the reply before the span is exported.
	isReserve := func(sp tracetest.SpanStub) bool { return strings.HasSuffix(sp.Name, "/Reserve") }
	spans := exp.GetSpans()
	for deadline := time.Now().Add(10 * time.Second); !slices.ContainsFunc(spans, isReserve) && time.Now().Before(deadline); spans = exp.GetSpans() {
		time.Sleep(10 * time.Millisecond)
	}
	found := slices.ContainsFunc(spans, isReserve)
	for _, sp := range spans {
		if !strings.HasSuffix(sp.Name, "/Reserve") {
			continue
		}
		if sp.SpanContext.TraceID() != span.SpanContext().TraceID() {
			t.Fatal("the ledger's span is not in the caller's trace")
		}
		attrs := map[string]string{}
		for _, a := range sp.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		for k, want := range map[string]string{"ledger.operation_id": id, "ledger.run_id": "run-9", "ledger.decision": "EXECUTE", "ledger.attempt": "1"} {
			if attrs[k] != want {
				t.Errorf("span attribute %s = %q, want %q", k, attrs[k], want)
			}
		}
	}
	if !found {
		t.Fatal("no Reserve span")
	}
}

// TestStoreErrorsWithoutCallers: a store the sweeper cannot reach counts in
// ledger_store_errors_total (LedgerStoreErrors) while no caller is there to
// get an error.
func TestStoreErrorsWithoutCallers(t *testing.T) {
	srv := redistest.Start(t)
	m := metrics.New(metrics.Options{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	l, err := ledger.New(srv.Client(t), ledger.Options{Observer: m.Observe, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(m.Handler())
	t.Cleanup(hs.Close)
	s := &stack{m: m, srv: hs}
	ctx := context.Background()
	if _, err := l.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"op": "Sweep", "kind": "unavailable"}
	if _, v := s.scrape(t); v("ledger_store_errors_total", labels) != 0 || v("ledger_script_duration_seconds", map[string]string{"op": "Sweep"}) != 1 {
		t.Fatal("a sweep of a reachable store: want no store error and one round trip observed")
	}
	srv.Stop()
	if _, err := l.Sweep(ctx); ledger.KindOf(err) != ledger.KindUnavailable {
		t.Fatalf("Sweep of a stopped store = %v", err)
	}
	if _, v := s.scrape(t); v("ledger_store_errors_total", labels) != 1 {
		t.Fatal("a sweep that cannot reach the store is not counted in ledger_store_errors_total")
	}
}

func TestCompactionMetrics(t *testing.T) {
	m := metrics.New(metrics.Options{})
	m.Observe(ledger.Event{Type: ledger.EventCompacted, Op: "Compact", Count: 3})
	m.Observe(ledger.Event{Type: ledger.EventCompacted, Op: "Compact", Count: 2})
	m.Observe(ledger.Event{Type: ledger.EventCompactionPass, Op: "Compact"})
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			if c := mt.GetCounter(); c != nil {
				got[f.GetName()] += c.GetValue()
			}
		}
	}
	if got["ledger_records_compacted_total"] != 5 || got["ledger_compaction_passes_total"] != 1 {
		t.Fatalf("compacted %v, passes %v", got["ledger_records_compacted_total"], got["ledger_compaction_passes_total"])
	}
}
