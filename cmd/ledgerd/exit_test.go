package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/server"
)

// runLedgerd runs ledgerd's main, in the test binary (runAsLedgerd), with
// args and env added to an environment without LEDGER_ variables; it
// returns the exit status and stderr. A command line ledgerd wrongly
// accepts would serve: it is killed after a minute, which fails the test.
func runLedgerd(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEDGER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, runAsLedgerd+"=1"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case ctx.Err() != nil:
		t.Fatalf("ledgerd %q did not exit (it serves?):\n%s", args, stderr.String())
	case errors.As(err, &ee):
		return ee.ExitCode(), stderr.String()
	}
	t.Fatalf("ledgerd %q: %v", args, err)
	return 0, ""
}

// TestExitStatus: a usage error (an unknown flag, a value ledgerd refuses,
// from a flag or its environment variable, flags it refuses together, a
// stray argument) exits 2, the flag package's convention, in ledgerd and in
// ledgerd keygen alike, with a "ledgerd: ..." line naming what is wrong; a
// failure at run time (a file it cannot read, an address in use) exits 1,
// with nothing served; -h exits 0. docs/configuration.md says so.
func TestExitStatus(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	missing := filepath.Join(t.TempDir(), "missing")
	redisURL := "redis://127.0.0.1:1/0"
	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want string // on stderr
	}{
		{nil, []string{"--bogus"}, 2, "ledgerd: flag provided but not defined"},
		{nil, []string{"--sweep-interval", "x"}, 2, "ledgerd: --sweep-interval"},
		{nil, []string{"--public-reflection=maybe"}, 2, "ledgerd: invalid boolean value"},
		{nil, []string{"--listen", "127.0.0.1:0", "stray"}, 2, "ledgerd: unexpected arguments [stray]: ledgerd takes flags only"},
		{nil, []string{"--tls-cert", "c.pem"}, 2, "ledgerd: --tls-cert and --tls-key go together"},
		{[]string{"LEDGER_RATE_LIMIT=x"}, nil, 2, "ledgerd: --rate-limit"},
		{[]string{"LEDGER_OTLP_INSECURE=maybe"}, nil, 2, "ledgerd: LEDGER_OTLP_INSECURE"},
		{nil, []string{"--log-level", "loud"}, 2, "ledgerd: --log-level"},
		{nil, []string{"--listen", "nope"}, 2, `ledgerd: --listen "nope": want HOST:PORT, e.g. 127.0.0.1:50051`},
		{nil, []string{"--listen", "127.0.0.1:0", "--metrics-listen", "nope"}, 2, `ledgerd: --metrics-listen "nope": want HOST:PORT, e.g. 127.0.0.1:9464`},
		{nil, []string{"--listen", "127.0.0.1:0", "--otlp-endpoint", "http://collector:4317"}, 2, `ledgerd: --otlp-endpoint "http://collector:4317": want HOST:PORT`},
		{nil, []string{"--listen", "0.0.0.0:0"}, 2, "ledgerd: --listen"},
		{nil, []string{"--listen", "127.0.0.1:0", "--http-listen", "nope"}, 2, `ledgerd: --http-listen "nope": want HOST:PORT, e.g. 127.0.0.1:8080`},
		{nil, []string{"--listen", "127.0.0.1:0", "--http-listen", "0.0.0.0:0"}, 2, `ledgerd: --http-listen "0.0.0.0:0": without authentication`},
		{nil, []string{"--key-prefix", "a:b"}, 2, "ledgerd: --key-prefix"},
		{nil, []string{"--redis-mode", "ring"}, 2, "ledgerd: --redis-mode"},
		{nil, []string{"--redis-mode", "ring", "--redis-url", redisURL}, 2, "ledgerd: --redis-mode"},
		{nil, []string{"--listen", "127.0.0.1:0", "--redis-mode", "cluster"}, 2, "ledgerd: --redis-mode cluster needs a Redis URL (set --redis-url)"},
		{[]string{"LEDGER_REDIS_MODE=sentinel"}, []string{"--listen", "127.0.0.1:0"}, 2, "ledgerd: --redis-mode sentinel needs a Redis URL (set --redis-url)"},
		{nil, []string{"--redis-url", "http://x"}, 2, "ledgerd: --redis-url"},
		{nil, []string{"--redis-url", redisURL, "--redis-ca", missing}, 2, "ledgerd: --redis-ca needs a rediss:// URL"},
		{nil, []string{"keygen", "--bogus"}, 2, "ledgerd: flag provided but not defined"},
		{nil, []string{"keygen", "--id", "a", "--tenant", "acme", "stray"}, 2, "ledgerd: keygen: unexpected arguments [stray]: keygen takes flags only (--id, --tenant, --scopes, --receipts)"},
		{nil, []string{"keygen", "--tenant", "acme"}, 2, "ledgerd: keygen: --id and --tenant are required"},
		{nil, []string{"keygen", "--receipts", "--tenant", "acme"}, 2, "ledgerd: keygen: --tenant belongs to an API key; --receipts makes a receipt signing key, which takes --id only"},
		{nil, []string{"keygen", "--receipts", "--scopes", "agent", "--tenant", "acme"}, 2, "ledgerd: keygen: --scopes and --tenant belong to an API key"},
		{nil, []string{"--listen", "127.0.0.1:0", "--policy", missing}, 1, "ledgerd: "},
		{nil, []string{"--listen", "127.0.0.1:0", "--auth-file", missing}, 1, "ledgerd: "},
		{nil, []string{"--listen", "127.0.0.1:0", "--receipt-keys", missing}, 1, "ledgerd: --receipt-keys: open " + missing},
		{nil, []string{"--listen", busy.Addr().String()}, 1, "ledgerd: --listen: listen tcp " + busy.Addr().String()},
		// Every address is bound before any serves: one in use stops the
		// start with nothing served.
		{nil, []string{"--listen", "127.0.0.1:0", "--http-listen", busy.Addr().String()}, 1, "ledgerd: --http-listen: listen tcp " + busy.Addr().String()},
		{nil, []string{"--listen", "127.0.0.1:0", "--metrics-listen", busy.Addr().String()}, 1, "ledgerd: --metrics-listen: listen tcp " + busy.Addr().String()},
		{nil, []string{"-h"}, 0, "-listen"},
		{nil, []string{"-h"}, 0, "ledgerd keygen --id ID --tenant TENANT"},
		{nil, []string{"--listen", "127.0.0.1:0", "help"}, 2, "ledgerd takes flags only (--name value, or --name=value), or keygen first"},
		{nil, []string{"keygen", "-h"}, 0, "-tenant"},
	} {
		code, stderr := runLedgerd(t, tc.env, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s ledgerd %q: exit %d, want %d with %q:\n%s", strings.Join(tc.env, " "), tc.args, code, tc.code, tc.want, stderr)
		}
		if tc.code != 0 && strings.Contains(stderr, ` serving"`) {
			t.Errorf("%s ledgerd %q served before it failed:\n%s", strings.Join(tc.env, " "), tc.args, stderr)
		}
	}
}

// TestListenUsageSaysWhenBeyondLoopback: ledgerd -h says what --listen
// takes as checkListen has it (and docs/configuration.md): loopback without
// --auth-file, beyond it with --auth-file and TLS (or --allow-plaintext),
// not "loopback only".
func TestListenUsageSaysWhenBeyondLoopback(t *testing.T) {
	if err := checkListen(config{listen: "10.0.0.1:1", authFile: "f", tls: server.TLSFiles{Cert: "c", Key: "k"}}); err != nil {
		t.Fatalf("checkListen refuses a non-loopback address with authentication and TLS: %v", err)
	}
	fs, _ := newFlagSet(&config{}, io.Discard)
	u := fs.Lookup("listen").Usage
	for _, want := range []string{"host:port", "loopback", "--auth-file", "TLS", "--allow-plaintext"} {
		if !strings.Contains(u, want) {
			t.Errorf("the usage of --listen lacks %q: %s", want, u)
		}
	}
	if strings.Contains(u, "loopback only)") {
		t.Errorf("the usage of --listen says loopback only: %s", u)
	}
}
