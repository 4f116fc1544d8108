package main

import "golang.org/x/sys/unix"

// openFileLimit returns the process's open-file limit (the soft
// RLIMIT_NOFILE, which Go raised to the hard one at start), and false when
// it cannot be read or is unlimited.
func openFileLimit() (uint64, bool) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return 0, false
	}
	return r.Cur, true
}
