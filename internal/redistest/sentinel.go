package redistest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartSentinel starts a Redis Sentinel that monitors master under name
// (quorum 1, 1s down-after), and stops it at the test's end.
func StartSentinel(tb testing.TB, master *Server, name string) *Server {
	tb.Helper()
	skipShort(tb, "Redis Sentinel")
	path, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(MissingMessage)
	}
	host, port, _ := net.SplitHostPort(master.Addr)
	dir := tb.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
		name, host, port, name, name)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	for range 5 {
		p, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), Dir: dir}
		s.cmd = exec.Command(path, conf, "--sentinel", "--port", strconv.Itoa(p), "--bind", "127.0.0.1", "--dir", dir)
		s.output = &bytes.Buffer{}
		s.cmd.Stdout, s.cmd.Stderr = s.output, s.output
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := s.cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		s.done = make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(s.done) }()
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) && s.Running() {
			if _, err := sc.GetMasterAddrByName(tb.Context(), name).Result(); err == nil {
				_ = sc.Close()
				tb.Cleanup(s.Stop)
				return s
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = sc.Close()
		s.Stop()
	}
	tb.Fatal("redis sentinel did not start")
	return nil
}
