package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runAsLedgerbench, set to 1 in the environment, makes the test binary run
// ledgerbench's main with its arguments instead of the tests.
const runAsLedgerbench = "LEDGERBENCH_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runAsLedgerbench) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestExitStatus: a usage error (an unknown flag, a value ledgerbench
// refuses, flags it does not take together, a stray argument, neither
// --ledgerd nor --addr) exits 2, the flag package's convention, in
// ledgerbench and its serve-bare and cycle-inproc commands alike, with a line naming what
// is wrong; a failure at run time (a binary it cannot start) exits 1; -h
// exits 0. A command line wrongly accepted would start measuring: it is
// killed after a minute, which fails the test.
func TestExitStatus(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		args []string
		code int
		want string // on stderr
	}{
		{[]string{"--bogus"}, 2, "ledgerbench: flag provided but not defined"},
		{[]string{"--concurrency", "x"}, 2, "ledgerbench: invalid value"},
		{[]string{"--ledgerd", missing, "stray"}, 2, "ledgerbench: unexpected arguments"},
		{[]string{"--ledgerd", missing, "--growth", "x"}, 2, "ledgerbench: --growth"},
		{[]string{"--ledgerd", missing, "--only", "nope"}, 2, "ledgerbench: --only"},
		{[]string{"--ledgerd", missing, "--only", "pair"}, 2, "ledgerbench: --only pair: needs --against"},
		{[]string{"--ledgerd", missing, "--only", "bare-pair", "--bare=false"}, 2, "ledgerbench: --only bare-pair: needs the bare server"},
		{[]string{"--ledgerd", missing, "--instruction-cycles", "0"}, 2, "ledgerbench: --instruction-cycles"},
		{nil, 2, "ledgerbench: --ledgerd"},
		{[]string{"--addr", "127.0.0.1:1", "--server-cpus", "0"}, 2, "ledgerbench: --server-cpus"},
		{[]string{"serve-bare", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"serve-bare", "stray"}, 2, "ledgerbench serve-bare: unexpected arguments"},
		{[]string{"cycle-inproc", "--count", "x"}, 2, "invalid value"},
		{[]string{"cycle-inproc", "stray"}, 2, "ledgerbench cycle-inproc: unexpected arguments"},
		{[]string{"cycle-inproc", "--redis-addr", "127.0.0.1:1", "--count", "1"}, 1, "ledgerbench cycle-inproc: "},
		{[]string{"--ledgerd", missing, "--redis-server", missing, "--bare=false"}, 1, "ledgerbench: "},
		{[]string{"-h"}, 0, "-ledgerd"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, self, tc.args...)
		cmd.Env = append(os.Environ(), runAsLedgerbench+"=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		timedOut := ctx.Err() != nil
		cancel()
		code := 0
		var ee *exec.ExitError
		switch {
		case timedOut:
			t.Errorf("ledgerbench %q did not exit:\n%s", tc.args, stderr.String())
			continue
		case errors.As(err, &ee):
			code = ee.ExitCode()
		case err != nil:
			t.Fatalf("ledgerbench %q: %v", tc.args, err)
		}
		if code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("ledgerbench %q: exit %d, want %d with %q:\n%s", tc.args, code, tc.code, tc.want, stderr.String())
		}
	}
}

// TestAddrUsageSaysWhatRuns: ledgerbench -h says what --addr measures as
// docs/benchmarks.md does, and as bench.Run has it: the throughput and the
// latency (concurrency 1) runs, without the parts that start servers of
// their own (the bare server, memory, growth).
func TestAddrUsageSaysWhatRuns(t *testing.T) {
	var stderr bytes.Buffer
	if err := run([]string{"-h"}, io.Discard, &stderr); err != nil {
		t.Fatal(err)
	}
	var addr string
	for _, l := range strings.Split(stderr.String(), "\n  -") {
		if strings.HasPrefix(l, "addr ") {
			addr = l
		}
	}
	for _, want := range []string{"throughput and latency", "bare server", "memory", "growth"} {
		if !strings.Contains(addr, want) {
			t.Errorf("the usage of --addr lacks %q: %s", want, addr)
		}
	}
}
