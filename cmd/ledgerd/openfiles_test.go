package main

import (
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestCheckOpenFilesBoundary: a limit that holds exactly --max-connections,
// the Redis connections and the margin is enough; one less warns, and names
// the --max-connections that fits it.
func TestCheckOpenFilesBoundary(t *testing.T) {
	const maxConns, redisConns = 1000, 30
	need := uint64(maxConns + redisConns + openFilesMargin)
	for _, tc := range []struct {
		maxConns int
		limit    uint64
		want     string // "" for no warning
	}{
		{maxConns, need, ""},
		{maxConns, need - 1, `"fits_max_connections":999`},
		{-1, 10, ""}, // no limit
		{maxConns, 50, `"fits_max_connections":0`},
	} {
		out := &ledgertest.Buffer{}
		log, err := newLogger("info", out)
		if err != nil {
			t.Fatal(err)
		}
		checkOpenFiles(log, tc.maxConns, redisConns, tc.limit)
		got := strings.Count(out.String(), "open-file limit too low")
		switch {
		case tc.want == "" && got != 0:
			t.Errorf("--max-connections %d, limit %d: warned:\n%s", tc.maxConns, tc.limit, out.String())
		case tc.want != "" && (got != 1 || !strings.Contains(out.String(), tc.want)):
			t.Errorf("--max-connections %d, limit %d: %d warnings, want one with %s:\n%s", tc.maxConns, tc.limit, got, tc.want, out.String())
		}
	}
}
