package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// command is a command upstream's transport: go-sdk's CommandTransport,
// but for the lines the command writes to stdout that are no JSON-RPC
// messages (a banner, a stray print, a log line), which it drops (see
// messageLines). go-sdk would end the session at the first one, and with
// it every call in flight; the official TypeScript and Python clients
// pass over them.
type command struct {
	cmd *exec.Cmd
	// dropped is told the length of each line dropped.
	dropped func(n int)
}

// terminateWait is how long a command is given to exit after its stdin is
// closed, and again after SIGTERM, before it is killed.
const terminateWait = 2 * time.Second

// Connect starts the command and connects to it over its stdin and
// stdout.
func (c *command) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := c.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	t := &mcp.IOTransport{
		Reader:        io.NopCloser(newMessageLines(stdout, c.dropped)), // the connection ends by closing stdin
		Writer:        &commandInput{WriteCloser: stdin, cmd: c.cmd},
		MaxLineLength: maxMessage,
	}
	return t.Connect(ctx)
}

// commandInput is a command's standard input. Closing it ends the
// command as MCP's stdio transport says: stdin closed, then SIGTERM, then
// SIGKILL, each after terminateWait; it waits for the command to exit.
type commandInput struct {
	io.WriteCloser
	cmd *exec.Cmd
}

// Close ends the command, and returns how it exited.
func (s *commandInput) Close() error {
	if err := s.WriteCloser.Close(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- s.cmd.Wait() }()
	for _, signal := range []func() error{
		func() error { return nil },
		func() error { return s.cmd.Process.Signal(syscall.SIGTERM) },
		s.cmd.Process.Kill,
	} {
		_ = signal() // one that fails finds the command exited, or the next one follows
		select {
		case err := <-exited:
			return err
		case <-time.After(terminateWait):
		}
	}
	return errors.New("the upstream command did not exit")
}

// messageLines passes on the lines of r that may be JSON-RPC messages:
// one that starts with "[" (a batch), or with "{" and holds the text
// "jsonrpc" in double quotes (a member every message has). It drops
// the others, telling dropped their length. A line longer than
// maxMessage passes unseen, for go-sdk to refuse.
type messageLines struct {
	r       *bufio.Reader
	dropped func(n int)
	line    []byte // what is left to pass on of the current line
	long    bool   // the current line is longer than maxMessage
	err     error  // r's error, returned once line is passed on
}

func newMessageLines(r io.Reader, dropped func(n int)) *messageLines {
	return &messageLines{r: bufio.NewReaderSize(r, 64<<10), dropped: dropped}
}

func (m *messageLines) Read(p []byte) (int, error) {
	for len(m.line) == 0 {
		if m.err != nil {
			return 0, m.err
		}
		m.next()
	}
	n := copy(p, m.line)
	m.line = m.line[n:]
	return n, nil
}

// next reads the next line, or the next part of a long one, into line,
// unless it is dropped.
func (m *messageLines) next() {
	if m.long {
		m.line, m.err = m.r.ReadSlice('\n')
		if !errors.Is(m.err, bufio.ErrBufferFull) {
			m.long = false
		} else {
			m.err = nil
		}
		return
	}
	line, err := m.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		line = bytes.Clone(line)
		for errors.Is(err, bufio.ErrBufferFull) && len(line) <= maxMessage {
			var part []byte
			part, err = m.r.ReadSlice('\n')
			line = append(line, part...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			m.line, m.long = line, true
			return
		}
	}
	m.err = err
	if message(line) {
		m.line = line
	} else if len(bytes.TrimSpace(line)) > 0 && m.dropped != nil {
		m.dropped(len(line))
	}
}

// message reports whether line may be a JSON-RPC message: it starts with
// "[", or with "{" and holds "jsonrpc" in double quotes.
func message(line []byte) bool {
	line = bytes.TrimLeft(line, " \t\r\n")
	return len(line) > 0 && (line[0] == '[' || line[0] == '{' && bytes.Contains(line, []byte(`"jsonrpc"`)))
}
