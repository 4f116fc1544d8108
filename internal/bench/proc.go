// Package bench measures a running ledger service: a closed-loop gRPC load
// generator built on the generated client (health Check as the transport
// baseline, Reserve, Reserve+Complete cycles, Reserve replays, Lookup), the
// Redis memory its records take, and how both behave as the store grows.
// cmd/ledgerbench drives it (`make bench`); docs/benchmarks.md has the
// numbers and what limits them.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Process is a child process the benchmark started (redis-server, ledgerd
// or the bare server), killed with Stop.
type Process struct {
	Addr string // host:port it serves
	cmd  *exec.Cmd
	done chan struct{}
	out  *bytes.Buffer
}

// Stop kills the process and waits for it.
func (p *Process) Stop() {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// start starts path with args, on the server CPUs of pl when it is set.
func (p *Process) start(pl *placement, path string, args []string, stdout *os.File) error {
	path, args = pl.command(path, args)
	p.cmd = exec.Command(path, args...)
	p.out = &bytes.Buffer{}
	if stdout != nil {
		p.cmd.Stdout, p.cmd.Stderr = stdout, stdout
	} else {
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	}
	// The child dies with the benchmark.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return err
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	return nil
}

func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// FreeAddr returns a free loopback address.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// onFreePort calls start with a free loopback address, and again with
// another (three tries in all) when the server could not bind it: another
// process may take the port between FreeAddr's look and the server's bind.
func onFreePort(start func(addr string) (*Process, error)) (*Process, error) {
	for try := 1; ; try++ {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		p, err := start(addr)
		if err == nil || try == 3 || !strings.Contains(strings.ToLower(err.Error()), "address already in use") {
			return p, err
		}
	}
}

// StartRedis starts a fresh redis-server on a free loopback port with its
// working directory in dir, no persistence, and the default memory settings
// (the record encoding is measured against Redis's defaults).
func StartRedis(path, dir string, args ...string) (*Process, error) {
	return startRedisOn(nil, path, dir, args)
}

// startRedisOn is StartRedis on the server CPUs of pl (all when nil).
func startRedisOn(pl *placement, path, dir string, args []string) (*Process, error) {
	return startRedisUnder(pl, nil, path, dir, args)
}

// startRedisUnder is startRedisOn with redis-server run under the command
// wrap (none when empty).
func startRedisUnder(pl *placement, wrap []string, path, dir string, args []string) (*Process, error) {
	if path == "" {
		path = "redis-server"
	}
	bin, err := exec.LookPath(path)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (%v): install it (apt-get install redis-server) or pass its path", err)
	}
	return onFreePort(func(addr string) (*Process, error) { return startRedis(pl, wrap, bin, addr, dir, args) })
}

// startRedis starts the redis-server bin on addr, under the command wrap
// when it is set (wrap, then bin and its arguments).
func startRedis(pl *placement, wrap []string, bin, addr, dir string, args []string) (*Process, error) {
	_, port, _ := net.SplitHostPort(addr)
	p := &Process{Addr: addr}
	argv := append([]string{"--bind", "127.0.0.1", "--port", port, "--dir", dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--logfile", ""}, args...)
	if len(wrap) > 0 {
		argv = append(append(wrap[1:len(wrap):len(wrap)], bin), argv...)
		bin = wrap[0]
	}
	if err := p.start(pl, bin, argv, nil); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return nil, fmt.Errorf("redis-server exited: %s", strings.TrimSpace(p.out.String()))
		}
		if pid, err := redisPID(addr); err == nil {
			if pid != p.cmd.Process.Pid {
				// Another server had the port: ours could not bind it.
				p.Stop()
				return nil, fmt.Errorf("redis-server: %s: address already in use (by pid %d)", addr, pid)
			}
			return p, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.Stop()
	return nil, errors.New("redis-server did not answer within 10s")
}

// redisPID asks the Redis at addr for its process id, within a second.
func redisPID(addr string) (int, error) {
	r, err := DialRedis(addr)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	r.timeout = time.Second
	v, err := r.Do("INFO", "server")
	if err != nil {
		return 0, err
	}
	info, _ := v.(string)
	for _, line := range strings.Split(info, "\n") {
		if pid, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(pid)
		}
	}
	return 0, errors.New("INFO server without process_id")
}

// StartLedgerd starts the ledgerd binary on a free loopback port against the
// Redis at redisAddr, with extra flags, and waits until its health check
// answers SERVING. Its log goes to logFile.
func StartLedgerd(bin, redisAddr, logFile string, flags ...string) (*Process, error) {
	return startLedgerdOn(nil, bin, redisAddr, logFile, flags)
}

// startLedgerdOn is StartLedgerd on the server CPUs of pl (all when nil).
func startLedgerdOn(pl *placement, bin, redisAddr, logFile string, flags []string) (*Process, error) {
	return onFreePort(func(addr string) (*Process, error) {
		args := append([]string{"--listen", addr, "--redis-url", "redis://" + redisAddr + "/0"}, flags...)
		return startServing(pl, bin, args, addr, logFile, "ledgerd")
	})
}

// startServing starts a gRPC server process (on the server CPUs of pl when
// set) that listens on addr and waits until its health check answers
// SERVING from that process (not from another that holds the port). Its
// output goes to logFile.
func startServing(pl *placement, bin string, args []string, addr, logFile, what string) (*Process, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p := &Process{Addr: addr}
	if err := p.start(pl, bin, args, f); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.Stop()
		return nil, err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if p.exited() {
			return nil, fmt.Errorf("%s exited; its log: %s", what, lastLines(logFile, 5))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		res, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			owns, known, err := listenerOwner(p.cmd.Process.Pid, addr)
			if err != nil {
				p.Stop()
				return nil, fmt.Errorf("%s: who listens on %s: %w", what, addr, err)
			}
			if known && !owns {
				// Another process's server answered: ours could not bind the port.
				p.Stop()
				return nil, fmt.Errorf("%s: %s: address already in use (by another process)", what, addr)
			}
			return p, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.Stop()
	return nil, fmt.Errorf("%s did not become SERVING within 20s; its log: %s", what, lastLines(logFile, 5))
}

func lastLines(file string, n int) string {
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Redis is a minimal RESP client for the benchmark's own questions to the
// store (INFO, CONFIG, DBSIZE): it keeps the measuring side independent of
// the client library under test.
type Redis struct {
	c       net.Conn
	r       *bufio.Reader
	timeout time.Duration // of each command; 30s when 0
}

// DialRedis connects to addr.
func DialRedis(addr string) (*Redis, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &Redis{c: c, r: bufio.NewReader(c)}, nil
}

// Close closes the connection.
func (r *Redis) Close() { _ = r.c.Close() }

// Do sends one command and returns its reply: a string, an int64, nil, or a
// []any of those.
func (r *Redis) Do(args ...string) (any, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	timeout := r.timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	_ = r.c.SetDeadline(time.Now().Add(timeout))
	if _, err := r.c.Write(b.Bytes()); err != nil {
		return nil, err
	}
	return r.read()
}

func (r *Redis) read() (any, error) {
	line, err := r.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New(line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = r.read(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// Info returns the fields of an INFO section.
func (r *Redis) Info(section string) (map[string]string, error) {
	v, err := r.Do("INFO", section)
	if err != nil {
		return nil, err
	}
	s, _ := v.(string)
	out := map[string]string{}
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			out[k] = v
		}
	}
	return out, nil
}

// InfoInt returns one integer field of an INFO section.
func (r *Redis) InfoInt(section, field string) (int64, error) {
	m, err := r.Info(section)
	if err != nil {
		return 0, err
	}
	v, ok := m[field]
	if !ok {
		return 0, fmt.Errorf("INFO %s has no %s", section, field)
	}
	return strconv.ParseInt(v, 10, 64)
}
