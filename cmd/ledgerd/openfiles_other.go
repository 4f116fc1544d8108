//go:build !linux

package main

// openFileLimit returns false: the open-file limit is checked on Linux
// only.
func openFileLimit() (uint64, bool) { return 0, false }
