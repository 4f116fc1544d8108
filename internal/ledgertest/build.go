package ledgertest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// raceEnabled is set when this binary is built with -race (race.go).
var raceEnabled bool

// LedgerdBinary builds cmd/ledgerd into dir once per test binary and returns
// its path: with -race when the tests run with it, so the build cache is
// shared with the rest of the suite and ledgerd reports its own races. Later
// calls return the first path while the file is there, and build into their
// own dir again once it is gone (a t.TempDir of an earlier test, as with
// go test -count=2).
func LedgerdBinary(tb testing.TB, dir string) string {
	tb.Helper()
	return ledgerd.path(tb, dir)
}

// LedgermcpBinary builds cmd/ledgermcp into dir once per test binary, as
// LedgerdBinary builds ledgerd, and returns its path.
func LedgermcpBinary(tb testing.TB, dir string) string {
	tb.Helper()
	return ledgermcp.path(tb, dir)
}

// LedgerctlBinary builds cmd/ledgerctl into dir once per test binary, as
// LedgerdBinary builds ledgerd, and returns its path.
func LedgerctlBinary(tb testing.TB, dir string) string {
	tb.Helper()
	return ledgerctl.path(tb, dir)
}

var (
	ledgerd   = &binary{name: "ledgerd"}
	ledgermcp = &binary{name: "ledgermcp"}
	ledgerctl = &binary{name: "ledgerctl"}
)

// binary is a command of the module, built once per test binary while
// the file built lasts.
type binary struct {
	name string
	mu   sync.Mutex
	bin  string // the file built, "" before the first build
	err  error  // the first build's failure, which stands
}

// path returns the command built, building it into dir when it was never
// built or its file is gone.
func (b *binary) path(tb testing.TB, dir string) string {
	tb.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err == nil && (b.bin == "" || !isFile(b.bin)) {
		b.bin, b.err = build(b.name, dir)
	}
	if b.err != nil {
		tb.Fatal(b.err)
	}
	return b.bin
}

// build builds ./cmd/name of the module into dir, with -race when this
// binary has it, and returns the file's path.
func build(name, dir string) (string, error) {
	out, _, err := run(buildTimeout, "", "go", "env", "GOMOD")
	mod := strings.TrimSpace(string(out))
	if err != nil || mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not in the module (%v)", err)
	}
	bin := filepath.Join(dir, name)
	args := []string{"build"}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "-o", bin, "./cmd/"+name)
	if out, errOut, err := run(buildTimeout, filepath.Dir(mod), "go", args...); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return bin, nil
}

// isFile reports whether a regular file is at path.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// buildTimeout bounds each go command LedgerdBinary and LedgermcpBinary run. It is generous
// (a cold build with -race on a loaded machine), yet well within the test
// timeout of make test: a command that does not end fails the tests that
// need ledgerd, saying so, rather than hold them until the test binary is
// killed.
const buildTimeout = 5 * time.Minute

// run runs name with args in dir (the current directory when empty) and
// returns its standard output and error. A command still running at timeout
// is killed, and the error says it did not finish; its output is waited for
// at most 10s after it exits or is killed (a process it started may hold it
// open).
func run(timeout time.Duration, dir, name string, args ...string) ([]byte, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%s did not finish within %s (%v)", name, timeout, err)
	}
	return out.Bytes(), errOut.Bytes(), err
}
