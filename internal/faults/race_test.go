//go:build race

package faults

func init() { raceEnabled = true }
