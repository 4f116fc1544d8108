package fingerprint

import "testing"

// refundParams are a refund's parameters, as an agent sends them (the
// shape internal/bench uses).
func refundParams() map[string]any {
	return map[string]any{"charge": "ch_3MmlLrLkdIwHu7ix0snN0B15", "amount": 1250.0, "currency": "eur", "reason": "requested_by_customer"}
}

// BenchmarkCompute is the fingerprint of every Reserve: canonical JSON of
// the parameters and its SHA-256.
func BenchmarkCompute(b *testing.B) {
	params := refundParams()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compute(params, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkComputeFields fingerprints a selection of consequential fields.
func BenchmarkComputeFields(b *testing.B) {
	params := refundParams()
	fields := []string{"/amount", "/currency", "/charge"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compute(params, fields); err != nil {
			b.Fatal(err)
		}
	}
}
