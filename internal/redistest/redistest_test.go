package redistest

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLaunchOnATakenPort: a redis-server started on a port another one
// holds is reported as not started (so startWith tries another port), even
// though something answers on that port.
func TestLaunchOnATakenPort(t *testing.T) {
	other := Start(t)
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(MissingMessage)
	}
	port := other.Addr[strings.LastIndexByte(other.Addr, ':')+1:]
	s := &Server{Addr: other.Addr, Dir: t.TempDir(), args: []string{"--port", port}}
	err = s.launch(path)
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "address already in use") {
		t.Fatalf("launch on %s, held by another redis-server = %v", other.Addr, err)
	}
	if s.Running() {
		s.Stop()
		t.Fatal("the server that could not bind its port is still running")
	}
}
