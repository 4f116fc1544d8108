package ledgertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunBounded: a command that does not end (here sleep) is stopped at
// run's timeout and reported as such, rather than waited for until the test
// binary is killed.
func TestRunBounded(t *testing.T) {
	t.Parallel()
	done := make(chan error, 1)
	go func() {
		_, _, err := run(100*time.Millisecond, "", "sleep", "600")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "did not finish within 100ms") {
			t.Fatalf("run of a command that does not end = %v, want an error saying it did not finish", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("run still waits, 2 minutes after its timeout of 100ms, for a command that does not end")
	}
}

// TestRunOutput: run returns the standard output and error of a command
// apart, and its failure.
func TestRunOutput(t *testing.T) {
	t.Parallel()
	out, errOut, err := run(time.Minute, t.TempDir(), "sh", "-c", "pwd; echo oops >&2; exit 3")
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("run of a command that exits 3 = %v", err)
	}
	if !strings.Contains(string(out), "TestRunOutput") || string(errOut) != "oops\n" {
		t.Fatalf("run: stdout %q, stderr %q: want the working directory, then oops", out, errOut)
	}
}

// TestBinaryBuiltAgainWhenGone: a command is built once, and built again
// into the dir of the call that finds its file gone (the t.TempDir of an
// earlier test, under go test -count=2).
func TestBinaryBuiltAgainWhenGone(t *testing.T) {
	b := &binary{name: "ledgerctl"}
	first, second := t.TempDir(), t.TempDir()
	for _, step := range []struct {
		dir, want string
		before    func()
	}{
		{first, filepath.Join(first, "ledgerctl"), nil},
		{second, filepath.Join(first, "ledgerctl"), nil},
		{second, filepath.Join(second, "ledgerctl"), func() { _ = os.RemoveAll(first) }},
	} {
		if step.before != nil {
			step.before()
		}
		if got := b.path(t, step.dir); got != step.want || !isFile(got) {
			t.Fatalf("path(%s) = %s (a file: %v), want %s", step.dir, got, isFile(got), step.want)
		}
	}
}
