//go:build race

package polyglot

func init() { raceEnabled = true }
