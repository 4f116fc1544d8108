package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
)

// TestOpenFileLimitWarning runs ledgerd in a process of its own under an
// open-file limit of 512 (soft and hard, so that Go's raise at start-up
// cannot lift it), with 20 Redis connections (pool_size and
// pipeline_pool_size 10). --max-connections 10000 needs far more
// descriptors than that: ledgerd says so once at start, naming the limit,
// the flag's value and both remedies. --max-connections 100, which fits, and
// 0 (no limit: nothing to compare) start without it.
func TestOpenFileLimitWarning(t *testing.T) {
	srv := redistest.Shared(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const warning = "open-file limit too low for --max-connections"
	for _, tc := range []struct {
		maxConns string
		warns    bool
	}{
		{"10000", true},
		{"100", false},
		{"0", false},
	} {
		t.Run("max-connections="+tc.maxConns, func(t *testing.T) {
			out := &ledgertest.Buffer{}
			cmd := exec.Command("bash", "-c", `ulimit -n 512 && exec "$0" "$@"`, self,
				"--listen", "127.0.0.1:0", "--redis-url", "redis://"+srv.Addr+"/0?pool_size=10&pipeline_pool_size=10",
				"--key-prefix", "ledger-openfiles", "--max-connections", tc.maxConns)
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "LEDGER_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, runAsLedgerd+"=1")
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			var waitErr error
			go func() { waitErr = cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			if _, err := ledgertest.ListenAddr(out.String, "ledgerd serving", exited, 20*time.Second); err != nil {
				t.Fatalf("ledgerd: %v\n%s", err, out.String())
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case <-exited:
			case <-time.After(20 * time.Second):
				t.Fatalf("ledgerd did not stop on SIGTERM:\n%s", out.String())
			}
			if waitErr != nil {
				t.Fatalf("ledgerd: %v\n%s", waitErr, out.String())
			}
			var lines []string
			for _, line := range strings.Split(out.String(), "\n") {
				if strings.Contains(line, warning) {
					lines = append(lines, line)
				}
			}
			if !tc.warns {
				if len(lines) != 0 {
					t.Fatalf("a warning with a limit that fits:\n%s", out.String())
				}
				return
			}
			if len(lines) != 1 {
				t.Fatalf("%d warnings about the open-file limit, want 1:\n%s", len(lines), out.String())
			}
			for _, want := range []string{`"level":"WARN"`, `"open_file_limit":512`, `"max_connections":` + tc.maxConns,
				"ulimit -n", "LimitNOFILE", "lower --max-connections"} {
				if !strings.Contains(lines[0], want) {
					t.Errorf("the warning lacks %s:\n%s", want, lines[0])
				}
			}
			if max := maxConnsThatFit(t, lines[0]); max <= 0 || max >= 512 {
				t.Errorf("the warning suggests --max-connections %d under a limit of 512:\n%s", max, lines[0])
			}
		})
	}
}

// maxConnsThatFit returns the "fits_max_connections" count of a warning
// line.
func maxConnsThatFit(t *testing.T, line string) int {
	t.Helper()
	const key = `"fits_max_connections":`
	i := strings.Index(line, key)
	if i < 0 {
		t.Fatalf("no %s in the warning:\n%s", key, line)
	}
	rest := line[i+len(key):]
	end := strings.IndexAny(rest, ",}")
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		t.Fatalf("%s %q: %v", key, rest[:end], err)
	}
	return n
}
