//go:build race

package ledgertest

func init() { raceEnabled = true }
