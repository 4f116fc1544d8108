// Package alertrules evaluates the Prometheus rules in docs/alerts.yml on
// the series that docs/alerts_test.yml gives, as `promtool test rules`
// does: every rule fires when it should, with its `for`, labels and
// annotations, and stays quiet when it should. It is a module of its own
// so that the ledger's module does not depend on Prometheus.
package alertrules
