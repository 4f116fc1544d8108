// Package gogc sets the garbage collection target of the project's
// servers, ledgerd and ledgermcp, unless the environment sets GOGC.
//
// Both have a live heap of a few MB and allocate on every call, so Go's
// default target of 100 collects many times a second under load. At 400
// ledgerd spends about a sixth less CPU per Reserve and ledgermcp about a
// third less per call, for a heap of at most five times the live one
// (docs/configuration.md, docs/benchmarks.md §6.4 and §9).
package gogc

import "runtime/debug"

// Percent is the target Tune sets.
const Percent = 400

// Tune sets Percent unless GOGC is set (getenv is os.Getenv). An empty
// GOGC counts as unset, as it does for the runtime.
func Tune(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
	}
}
