package alertrules

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"gopkg.in/yaml.v3"
)

// unitTests is the part of promtool's test file format this runner reads.
type unitTests struct {
	RuleFiles          []string       `yaml:"rule_files"`
	EvaluationInterval model.Duration `yaml:"evaluation_interval"`
	Tests              []struct {
		Name        string         `yaml:"name"`
		Interval    model.Duration `yaml:"interval"`
		InputSeries []struct {
			Series string `yaml:"series"`
			Values string `yaml:"values"`
		} `yaml:"input_series"`
		AlertRuleTests []struct {
			EvalTime  model.Duration `yaml:"eval_time"`
			Alertname string         `yaml:"alertname"`
			ExpAlerts []expAlert     `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

type expAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels"`
	ExpAnnotations map[string]string `yaml:"exp_annotations"`
}

// TestAlertRules runs docs/alerts_test.yml against docs/alerts.yml, and
// shows that the runner fails a test file whose expectations are wrong.
func TestAlertRules(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		edit func(*unitTests)
		want string // in a mismatch; "" for none
	}{
		{"as written", func(*unitTests) {}, ""},
		{"an expected alert dropped", func(u *unitTests) {
			for i := range u.Tests {
				for j := range u.Tests[i].AlertRuleTests {
					if len(u.Tests[i].AlertRuleTests[j].ExpAlerts) > 0 {
						u.Tests[i].AlertRuleTests[j].ExpAlerts = nil
						return
					}
				}
			}
		}, "fired"},
		{"an UNKNOWN one a minute early (its for: 1m)", func(u *unitTests) {
			for i := range u.Tests {
				for j := range u.Tests[i].AlertRuleTests {
					a := &u.Tests[i].AlertRuleTests[j]
					if slices.ContainsFunc(a.ExpAlerts, func(e expAlert) bool { return e.ExpLabels["state"] == "UNKNOWN" }) {
						a.EvalTime -= model.Duration(time.Minute)
						return
					}
				}
			}
		}, "did not fire"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var u unitTests
			dec := yaml.NewDecoder(strings.NewReader(string(raw)))
			dec.KnownFields(true)
			if err := dec.Decode(&u); err != nil {
				t.Fatal(err)
			}
			c.edit(&u)
			got := run(t, u)
			switch {
			case c.want == "" && len(got) > 0:
				t.Fatalf("docs/alerts_test.yml:\n%s", strings.Join(got, "\n"))
			case c.want != "" && !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, c.want) }):
				t.Fatalf("mismatches %q, want one saying %q", got, c.want)
			}
		})
	}
}

// run evaluates the rule files on each test's series at every evaluation
// interval, and returns how the alerts differ from the expected ones. It
// also reports an alerting rule that no test expects to fire.
func run(t *testing.T, u unitTests) []string {
	p := parser.NewParser(parser.Options{})
	var groups []rulefmt.RuleGroup
	for _, f := range u.RuleFiles {
		rgs, errs := rulefmt.ParseFile(filepath.Join("..", "docs", f), false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		if len(errs) > 0 {
			t.Fatalf("%s: %v", f, errs)
		}
		groups = append(groups, rgs.Groups...)
	}
	every := time.Duration(u.EvaluationInterval)
	if every == 0 {
		every = time.Minute
	}
	var out []string
	fired := map[string]bool{}
	for _, tc := range u.Tests {
		var load strings.Builder
		fmt.Fprintf(&load, "load %s\n", time.Duration(tc.Interval))
		for _, s := range tc.InputSeries {
			fmt.Fprintf(&load, "  %s %s\n", s.Series, s.Values)
		}
		st := promqltest.LoadedStorage(t, load.String())
		engine := promqltest.NewTestEngine(t, false, 5*time.Minute, 1e6)
		query := rules.EngineQueryFunc(engine, st)
		var alerting []*rules.AlertingRule
		for _, g := range groups {
			for _, r := range g.Rules {
				if r.Alert == "" {
					continue
				}
				expr, err := p.ParseExpr(r.Expr)
				if err != nil {
					t.Fatalf("%s: %v", r.Alert, err)
				}
				alerting = append(alerting, rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
					labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", false, nil))
			}
		}
		checks := tc.AlertRuleTests
		sort.SliceStable(checks, func(i, j int) bool { return checks[i].EvalTime < checks[j].EvalTime })
		var end time.Duration
		if len(checks) > 0 {
			end = time.Duration(checks[len(checks)-1].EvalTime)
		}
		next := 0
		for ts := time.Duration(0); ts <= end; ts += every {
			at := time.Unix(0, 0).UTC().Add(ts)
			for _, r := range alerting {
				if _, err := r.Eval(context.Background(), 0, at, query, nil, 0); err != nil {
					t.Fatalf("%s at %s: %v", r.Name(), ts, err)
				}
			}
			for ; next < len(checks) && time.Duration(checks[next].EvalTime) <= ts; next++ {
				c := checks[next]
				// Firing alerts by their labels; an expected one matches the
				// alert with its labels and the annotations it names.
				got := map[string]map[string]string{}
				for _, r := range alerting {
					if r.Name() != c.Alertname {
						continue
					}
					for _, a := range r.ActiveAlerts() {
						if a.State == rules.StateFiring {
							got[describe(a.Labels.Map())] = a.Annotations.Map()
						}
					}
				}
				if len(c.ExpAlerts) > 0 {
					fired[c.Alertname] = true
				}
				at := fmt.Sprintf("%s, %s at %s", tc.Name, c.Alertname, time.Duration(c.EvalTime))
				for _, e := range c.ExpAlerts {
					l := maps.Clone(e.ExpLabels)
					if l == nil {
						l = map[string]string{}
					}
					l["alertname"] = c.Alertname
					key := describe(l)
					ann, ok := got[key]
					delete(got, key)
					if !ok {
						out = append(out, fmt.Sprintf("%s: did not fire %s", at, key))
						continue
					}
					for k, v := range e.ExpAnnotations {
						if ann[k] != v {
							out = append(out, fmt.Sprintf("%s: %s has %s %q, want %q", at, key, k, ann[k], v))
						}
					}
				}
				for key := range got {
					out = append(out, fmt.Sprintf("%s: fired %s", at, key))
				}
			}
		}
	}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !fired[r.Alert] {
				out = append(out, fmt.Sprintf("%s: no test expects it to fire", r.Alert))
			}
		}
	}
	return out
}

// describe writes a label set in one sorted line.
func describe(l map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}
