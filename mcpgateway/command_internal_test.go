package mcpgateway

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
)

// TestMessageLines: a command's lines that may be JSON-RPC messages pass
// whole, however they are read; the others are dropped and told by their
// length; a line past maxMessage passes unseen.
func TestMessageLines(t *testing.T) {
	const msg = `{"jsonrpc":"2.0","id":1,"result":{}}` + "\n"
	long := `{"jsonrpc":"2.0","id":2,"result":{"text":"` + strings.Repeat("x", 200<<10) + `"}}` + "\n"
	junk := strings.Repeat("y", 100<<10) + "\n"
	huge := strings.Repeat("z", maxMessage+200<<10)
	for _, tc := range []struct {
		name, in, out string
		dropped       []int
	}{
		{name: "messages", in: msg + msg, out: msg + msg},
		{name: "a banner first", in: "Server running on stdio\n" + msg, out: msg, dropped: []int{24}},
		{name: "a JSON log line", in: msg + `{"level":30,"msg":"hi"}` + "\n" + msg, out: msg + msg, dropped: []int{24}},
		{name: "a printed dict", in: "{'id': 1}\r\n" + msg, out: msg, dropped: []int{11}},
		{name: "a batch", in: "[" + strings.TrimSpace(msg) + "]\n", out: "[" + strings.TrimSpace(msg) + "]\n"},
		{name: "blank lines", in: "\n  \n" + msg, out: msg},
		{name: "the last line unended", in: msg + strings.TrimSpace(msg), out: msg + strings.TrimSpace(msg)},
		{name: "longer than the buffer", in: junk + long + msg, out: long + msg, dropped: []int{len(junk)}},
		{name: "longer than maxMessage", in: "Server running on stdio\n" + huge, out: huge, dropped: []int{24}},
	} {
		reads := []struct {
			name string
			wrap func(io.Reader) io.Reader
		}{{"whole", func(r io.Reader) io.Reader { return r }}, {"a byte at a time", iotest.OneByteReader}}
		if len(tc.in) > 1<<20 {
			reads = reads[:1] // a byte at a time, 16 MiB take long under -race
		}
		for _, read := range reads {
			t.Run(tc.name+", "+read.name, func(t *testing.T) {
				var dropped []int
				m := newMessageLines(strings.NewReader(tc.in), func(n int) { dropped = append(dropped, n) })
				out, err := io.ReadAll(read.wrap(m))
				if err != nil || string(out) != tc.out || !slices.Equal(dropped, tc.dropped) {
					t.Fatalf("read %d bytes (%v), dropped %v; want %d bytes, dropped %v", len(out), err, dropped, len(tc.out), tc.dropped)
				}
			})
		}
	}
}

// FuzzMessageLines: whatever a command writes, what passes is its lines
// that may be messages, in order and whole, and the lengths dropped are
// those of the others that are not blank.
func FuzzMessageLines(f *testing.F) {
	for _, s := range []string{"", "\n", `{"jsonrpc":"2.0"}` + "\nhello\n[1]", "{'jsonrpc'}\r\n  {\"jsonrpc\"\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var want bytes.Buffer
		var wantDropped, dropped []int
		for _, line := range strings.SplitAfter(in, "\n") {
			if message([]byte(line)) {
				want.WriteString(line)
			} else if strings.TrimSpace(line) != "" {
				wantDropped = append(wantDropped, len(line))
			}
		}
		out, err := io.ReadAll(newMessageLines(strings.NewReader(in), func(n int) { dropped = append(dropped, n) }))
		if err != nil || !bytes.Equal(out, want.Bytes()) || !slices.Equal(dropped, wantDropped) {
			t.Fatalf("%q: passed %q (%v), dropped %v; want %q, dropped %v", in, out, err, dropped, want.Bytes(), wantDropped)
		}
	})
}

// TestCommandClosed: closing a command's connection ends the command,
// however little it listens: one that exits when its stdin closes, one
// that exits on SIGTERM, and one that must be killed.
func TestCommandClosed(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		signal       syscall.Signal // that ended it; 0: it exited
	}{
		{"exits when stdin closes", "cat >/dev/null", 0},
		{"exits on SIGTERM", "exec sleep 60", syscall.SIGTERM},
		{"killed", "trap '' TERM; while :; do sleep 1; done", syscall.SIGKILL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("sh", "-c", tc.script)
			conn, err := (&command{cmd: cmd}).Connect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			_ = conn.Close()
			if cmd.ProcessState == nil {
				t.Fatal("Close returned before the command ended")
			}
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if got := map[bool]syscall.Signal{true: ws.Signal(), false: 0}[ws.Signaled()]; got != tc.signal || !ws.Signaled() && ws.ExitStatus() != 0 {
				t.Fatalf("the command ended %v, want by signal %d (0: exited)", cmd.ProcessState, tc.signal)
			}
		})
	}
}

// BenchmarkMessageLines: what the stdout filter costs a command's
// message of 1 KiB, beside reading it unfiltered.
func BenchmarkMessageLines(b *testing.B) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{"text":"` + strings.Repeat("x", 1000) + `"}}` + "\n"
	in := strings.Repeat(msg, 1000)
	buf := make([]byte, 32<<10)
	for _, tc := range []struct {
		name string
		wrap func(io.Reader) io.Reader
	}{{"unfiltered", func(r io.Reader) io.Reader { return r }}, {"filtered", func(r io.Reader) io.Reader { return newMessageLines(r, nil) }}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				r := tc.wrap(strings.NewReader(in))
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
			}
		})
	}
}
