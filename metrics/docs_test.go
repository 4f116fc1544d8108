package metrics_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/mdtable"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/metrics"
)

// metricDef is a metric the service exports: its type ("counter",
// "gauge", "histogram") and label names.
type metricDef struct {
	typ    string
	labels []string
}

// descName and descLabels read a prometheus.Desc's name and variable
// labels from its String (Desc has no accessors).
var (
	descName   = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
)

// exportedMetrics returns every metric of the service (without the
// Prometheus client's own: isClientOwn), with its type and labels. The
// names and labels are every metric the registry describes; the types are
// read from samples, so every metric is given one here: a metric with
// none fails the test, and is to be exercised below.
func exportedMetrics(t *testing.T) map[string]metricDef {
	t.Helper()
	// A store of its own: the operation left UNKNOWN would count in other
	// tests' gauges.
	s := start(t, redistest.Start(t).Client(t), metrics.Options{})
	m := s.m
	ctx := context.Background()

	// The store's gauges: an operation UNKNOWN past its recovery window
	// (300ms for slow.*, see policy).
	id := "docs-" + client.NewHolder()
	r, err := s.c.Reserve(ctx, client.Op{ID: id, Tool: "slow.refund"}, client.NewHolder())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.MarkUnknown(ctx, id, r.Operation.FencingToken, "timeout"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, v := s.scrape(t); v("ledger_unresolved_overdue", map[string]string{"tool": "slow.refund"}) >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ledger_unresolved_overdue never rose, so its type cannot be read")
		}
	}
	// The ledger's events, one of each.
	for _, e := range []ledger.Event{
		{Type: ledger.EventScript, Op: "Reserve", Failed: true, ErrKind: ledger.KindUnavailable},
		{Type: ledger.EventConflict, Tool: "t", Differs: []string{"params"}},
		{Type: ledger.EventRefused, Op: "Complete", ErrKind: ledger.KindStaleToken},
		{Type: ledger.EventReconciled, Tool: "t", Finding: ledger.FindingApplied},
		{Type: ledger.EventTransition, Tool: "t", From: ledger.StatePending, To: ledger.StateFailedFinal, Reason: "RETRIES_EXHAUSTED", Attempt: 5},
		{Type: ledger.EventTransition, Tool: "t", From: ledger.StateRunning, To: ledger.StateUnknown, Reason: "ESCALATED", Attempt: 1},
		{Type: ledger.EventCompacted, Op: "Compact", Count: 1},
		{Type: ledger.EventCompactionPass, Op: "Compact"},
		{Type: ledger.EventRunEnded, Op: "Reserve", RunState: ledger.RunStateStepLimit, Count: 10},
		{Type: ledger.EventRefused, Op: "Reserve", ErrKind: ledger.KindRunEnded, RunState: ledger.RunStateStepLimit},
	} {
		m.Observe(e)
	}
	m.SetReloaded("credentials", true)
	m.SetDurability("appendonly", true)
	m.SetCertificateExpiry(time.Now())
	m.WatchConnections(func() (int, uint64) { return 1, 1 })
	m.WatchHealthWatches(func() (int, uint64) { return 1, 1 })

	// The scrape errors: a second instance on a store that cannot be
	// reached. Its families are gathered with the first's.
	down := metrics.New(metrics.Options{})
	rdb := redis.NewClient(&redis.Options{Addr: ledgertest.ClosedAddr(t), MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := ledger.New(rdb, ledger.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	down.WatchStore(l, time.Millisecond)

	// The scrape errors are counted while the registry is gathered: the
	// second gathering has them.
	if _, err := down.Registry().Gather(); err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, reg := range []*prometheus.Registry{m.Registry(), down.Registry()} {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				types[f.GetName()] = "counter"
			case dto.MetricType_GAUGE:
				types[f.GetName()] = "gauge"
			case dto.MetricType_HISTOGRAM:
				types[f.GetName()] = "histogram"
			default:
				types[f.GetName()] = strings.ToLower(f.GetType().String())
			}
		}
	}

	defs := map[string]metricDef{}
	ch := make(chan *prometheus.Desc)
	go func() { m.Registry().Describe(ch); close(ch) }()
	for d := range ch {
		ms := descName.FindStringSubmatch(d.String())
		if ms == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		name := ms[1]
		if isClientOwn(name) {
			continue
		}
		var labels []string
		if l := descLabels.FindStringSubmatch(d.String()); l != nil && l[1] != "" {
			labels = strings.Split(l[1], ",")
		}
		slices.Sort(labels)
		typ, ok := types[name]
		if !ok {
			t.Errorf("%s is registered but has no sample in this test, so its type is unknown: exercise it in exportedMetrics", name)
		}
		defs[name] = metricDef{typ: typ, labels: labels}
	}
	if len(defs) == 0 {
		t.Fatal("no metrics described")
	}
	return defs
}

// isClientOwn reports whether a metric is the Prometheus client's own (the
// Go runtime's, the process's, the handler's errors), which
// docs/operations.md names by prefix only.
func isClientOwn(name string) bool {
	for _, p := range []string{"go_", "process_", "promhttp_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// docMetrics is a row of the metrics table of docs/operations.md.
type docMetrics struct {
	where  string
	names  []string
	types  []string
	labels []string
}

var metricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)

// metricsTable reads the metrics table of docs/operations.md.
func metricsTable(t *testing.T) []docMetrics {
	t.Helper()
	d, err := mdtable.Read("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	s, ok := d.Section("Metrics")
	if !ok {
		t.Fatal("docs/operations.md: no section \"Metrics\"")
	}
	tb, ok := s.TableWith("metric", "type", "labels")
	if !ok {
		t.Fatal("docs/operations.md, section Metrics: no table with columns metric, type and labels")
	}
	var rows []docMetrics
	for _, r := range tb.Rows {
		row := docMetrics{where: tb.Where(r)}
		for _, c := range mdtable.CodeSpans(r.Cell(tb.Column("metric"))) {
			if metricName.MatchString(c) {
				row.names = append(row.names, c)
			}
		}
		for _, w := range strings.Split(r.Cell(tb.Column("type")), ",") {
			if w = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(w)), "s"); w != "" {
				row.types = append(row.types, w)
			}
		}
		labels := r.Cell(tb.Column("labels"))
		if spans := mdtable.CodeSpans(labels); len(spans) > 0 {
			row.labels = spans
		} else {
			for _, l := range strings.Split(labels, ",") {
				if l = strings.TrimSpace(l); l != "" {
					row.labels = append(row.labels, l)
				}
			}
		}
		slices.Sort(row.labels)
		if len(row.names) == 0 {
			t.Errorf("%s: a row of the metrics table names no metric", row.where)
		}
		rows = append(rows, row)
	}
	return rows
}

// TestDocsMatchMetrics holds the docs to the metrics the service exports:
// the metrics table of docs/operations.md, the alert rules of
// docs/alerts.yml, and every metric the README and docs/*.md name.
func TestDocsMatchMetrics(t *testing.T) {
	defs := exportedMetrics(t)
	t.Run("operations.md table", func(t *testing.T) { checkMetricsTable(t, defs) })
	t.Run("alerts.yml", func(t *testing.T) { checkAlertRules(t, defs) })
	t.Run("metric names in docs", func(t *testing.T) { checkMetricNames(t, defs) })
}

// checkMetricsTable holds the metrics table of docs/operations.md to the
// metrics the service exports: every metric in it, with its type and
// labels, and no metric in it that does not exist. A row of several
// metrics gives the union of their types and labels.
func checkMetricsTable(t *testing.T, defs map[string]metricDef) {
	documented := map[string]bool{}
	for _, row := range metricsTable(t) {
		var types, labels []string
		for _, name := range row.names {
			documented[name] = true
			def, ok := defs[name]
			if !ok {
				t.Errorf("%s: documents %s, which the service does not export", row.where, name)
				continue
			}
			if len(row.names) == 1 && (len(row.types) != 1 || row.types[0] != def.typ) {
				t.Errorf("%s: documents %s as %s; it is a %s", row.where, name, strings.Join(row.types, ", "), def.typ)
			}
			if len(row.names) == 1 && !slices.Equal(row.labels, def.labels) {
				t.Errorf("%s: documents %s with labels %q; it has %q", row.where, name, row.labels, def.labels)
			}
			if len(row.names) > 1 {
				for _, l := range def.labels {
					if !slices.Contains(row.labels, l) {
						t.Errorf("%s: does not document the label %s of %s", row.where, l, name)
					}
				}
				if !slices.Contains(row.types, def.typ) {
					t.Errorf("%s: does not document the type of %s, a %s", row.where, name, def.typ)
				}
			}
			types = append(types, def.typ)
			labels = append(labels, def.labels...)
		}
		if len(row.names) > 1 {
			for _, typ := range row.types {
				if !slices.Contains(types, typ) {
					t.Errorf("%s: documents the type %s, which none of its metrics has", row.where, typ)
				}
			}
			for _, l := range row.labels {
				if !slices.Contains(labels, l) {
					t.Errorf("%s: documents the label %s, which none of its metrics has", row.where, l)
				}
			}
		}
	}
	for _, name := range sortedNames(defs) {
		if !documented[name] {
			t.Errorf("docs/operations.md: the metrics table does not document %s (%s, labels %q)", name, defs[name].typ, defs[name].labels)
		}
	}
}

// promIdent is a metric name in a PromQL expression or in prose.
// testFileRef is a test file the docs cite, such as `ledger/ledger_test.go`.
var testFileRef = regexp.MustCompile("`[a-z0-9_./-]+_test\\.go`")

var promIdent = regexp.MustCompile(`\b(?:ledger|grpc_server)_[a-z0-9_]*[a-z0-9]`)

// selector is a metric name with label matchers: name{a="x", b!~"y"}.
var selector = regexp.MustCompile(`\b((?:ledger|grpc_server)_[a-z0-9_]*[a-z0-9])\{([^}]*)\}`)

var matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(?:"([^"]*)")?`)

// grouping is the label list of an aggregation's by or without clause.
var grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)

// aggregation is an aggregation operator applied to an expression.
var aggregation = regexp.MustCompile(`\b(?:sum|min|max|avg|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\(`)

// labelValues are the values the service gives the labels whose values
// come from an enumeration: a matcher that compares one of them with
// another value selects nothing (=) or everything (!=), silently.
func labelValues() map[string][]string {
	var states, effects, decisions, codeNames []string
	for s := ledger.StatePending; s <= ledger.StateUnknown; s++ {
		states = append(states, s.String())
	}
	for e := ledger.EffectReadOnly; e <= ledger.EffectIrreversible; e++ {
		effects = append(effects, e.String())
	}
	for d := ledger.DecisionExecute; d <= ledger.DecisionReconcile; d++ {
		decisions = append(decisions, strings.ToLower(d.String()))
	}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		codeNames = append(codeNames, c.String())
	}
	return map[string][]string{
		"state":     states,
		"from":      append([]string{"NONE"}, states...),
		"to":        states,
		"effect":    effects,
		"decision":  decisions,
		"grpc_code": codeNames,
	}
}

// metricOf returns the metric a series name belongs to (a histogram's
// _bucket, _sum and _count are its own), and its labels ("le" too for a
// bucket), or false when the service exports no such metric.
func metricOf(defs map[string]metricDef, series string) (string, []string, bool) {
	if d, ok := defs[series]; ok {
		return series, d.labels, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suffix)
		if d, found := defs[base]; ok && found && d.typ == "histogram" {
			if suffix == "_bucket" {
				return base, append(slices.Clone(d.labels), "le"), true
			}
			return base, d.labels, true
		}
	}
	return "", nil, false
}

// checkPromQL reports every series expr names that the service does not
// export, and every label matcher on a label its metric does not have.
func checkPromQL(t *testing.T, defs map[string]metricDef, where, expr string) {
	t.Helper()
	for _, name := range promIdent.FindAllString(expr, -1) {
		if _, _, ok := metricOf(defs, name); !ok {
			t.Errorf("%s: names %s, which the service does not export", where, name)
		}
	}
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		_, labels, ok := metricOf(defs, m[1])
		if !ok {
			continue // reported above
		}
		values := labelValues()
		for _, lm := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(labels, lm[1]) {
				t.Errorf("%s: selects %s by the label %s, which it does not have (%q)", where, m[1], lm[1], labels)
				continue
			}
			if known, ok := values[lm[1]]; ok && (lm[2] == "=" || lm[2] == "!=") && !slices.Contains(known, lm[3]) {
				t.Errorf("%s: compares the label %s of %s with %q, a value it never has (%q)", where, lm[1], m[1], lm[3], known)
			}
		}
	}
}

// exprLabels returns the labels of the metrics expr names (le too for a
// histogram's buckets), and the labels of its result: when it aggregates,
// those its outermost aggregation keeps (by: the clause's, without: the
// others, neither: none), else its metrics'.
func exprLabels(defs map[string]metricDef, expr string) (in, out []string) {
	for _, name := range promIdent.FindAllString(expr, -1) {
		if _, labels, ok := metricOf(defs, name); ok {
			in = append(in, labels...)
		}
	}
	loc := aggregation.FindStringIndex(expr)
	if loc == nil {
		return in, in
	}
	head := expr[loc[0]:loc[1]]
	g := grouping.FindStringSubmatch(head)
	if g == nil {
		return in, nil
	}
	var listed []string
	for _, l := range strings.Split(g[1], ",") {
		if l = strings.TrimSpace(l); l != "" {
			listed = append(listed, l)
		}
	}
	if strings.HasPrefix(g[0], "by") {
		return in, listed
	}
	for _, l := range in {
		if !slices.Contains(listed, l) {
			out = append(out, l)
		}
	}
	return in, out
}

// checkGrouping reports every label expr groups by (by or without) that
// none of its metrics has: the aggregation then keeps or drops nothing by
// it, and an alert or panel meant per value of it is one for them all.
func checkGrouping(t *testing.T, defs map[string]metricDef, where, expr string) {
	t.Helper()
	in, _ := exprLabels(defs, expr)
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(in, l) {
				t.Errorf("%s: groups by the label %s, which none of its metrics has (%q)", where, l, in)
			}
		}
	}
}

// templateLabel is a label an alert's annotation shows: {{ $labels.tool }}.
var templateLabel = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)

// checkAlertRules holds docs/alerts.yml to the service: every metric its
// expressions name is exported, with the labels they select and group on
// and values those labels take, every label its annotations show is one
// its expression's result has, and every runbook it links is a section of
// docs/operations.md.
func checkAlertRules(t *testing.T, defs map[string]metricDef) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Expr        string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatal(err)
	}
	ops, err := mdtable.Read("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := ops.Anchors()
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			where := "docs/alerts.yml, alert " + r.Alert
			if len(promIdent.FindAllString(r.Expr, -1)) == 0 {
				t.Errorf("%s: its expression names no metric of the service: %s", where, r.Expr)
			}
			checkPromQL(t, defs, where, r.Expr)
			checkGrouping(t, defs, where, r.Expr)
			_, out := exprLabels(defs, r.Expr)
			for _, key := range sortedKeys(r.Annotations) {
				for _, m := range templateLabel.FindAllStringSubmatch(r.Annotations[key], -1) {
					if !slices.Contains(out, m[1]) {
						t.Errorf("%s: its %s shows the label %s, which its expression's result does not have (%q): it would show as empty", where, key, m[1], out)
					}
				}
			}
			if doc, anchor, ok := strings.Cut(r.Annotations["runbook"], "#"); ok && doc == "docs/operations.md" && !anchors[anchor] {
				t.Errorf("%s: its runbook links docs/operations.md#%s, which is no heading there", where, anchor)
			}
		}
	}
	if n == 0 {
		t.Fatal("docs/alerts.yml: no rules read")
	}
}

// checkMetricNames holds every metric name in the README and docs/*.md
// (PromQL examples, prose), with the labels it selects on, to the metrics
// the service exports.
func checkMetricNames(t *testing.T, defs map[string]metricDef) {
	docs, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join("..", "README.md"))
	for _, path := range docs {
		name := filepath.ToSlash(strings.TrimPrefix(path, ".."+string(filepath.Separator)))
		d, err := mdtable.Read(name)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range d.Lines {
			l = testFileRef.ReplaceAllString(l, "") // ledger/ledger_test.go names no metric
			checkPromQL(t, defs, d.All().Where(i+1), l)
			for _, c := range mdtable.CodeSpans(l) {
				if promIdent.MatchString(c) {
					checkGrouping(t, defs, d.All().Where(i+1), c)
				}
			}
		}
	}
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedNames(m map[string]metricDef) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
