package redistest

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestSharedClusterRidesOutAStall: a master of a cluster set up as the
// shared one, stalled for three times StartCluster's node timeout (as a
// redis-server starved of CPU on a busy machine is), is not marked failing
// by the others, is not failed over, and every node serves on once it
// runs again.
func TestSharedClusterRidesOutAStall(t *testing.T) {
	c, err := startCluster(t.TempDir(), 3, 1, sharedClusterArgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	ctx := context.Background()
	stalled := c.MasterFor(t, "{stall}k")
	var other *Server
	for _, s := range c.Nodes {
		if s != stalled && strings.Contains(infoOf(t, s, "replication"), "role:master") {
			other = s
			break
		}
	}
	if err := stalled.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = stalled.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	time.Sleep(3 * time.Second) // the stall: three node timeouts of StartCluster's
	cl := redis.NewClient(&redis.Options{Addr: other.Addr, DisableIdentity: true})
	defer cl.Close()
	nodes, err := cl.ClusterNodes(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	resume()
	for _, line := range strings.Split(nodes, "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.HasPrefix(f[1], stalled.Addr+"@") && strings.Contains(f[2], "fail") {
			t.Fatalf("the stalled master is marked %s by %s:\n%s", f[2], other.Addr, nodes)
		}
	}
	if !strings.Contains(infoOf(t, stalled, "replication"), "role:master") {
		t.Fatal("the stalled master was failed over")
	}
	for _, s := range c.Nodes {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
		info, err := cl.ClusterInfo(ctx).Result()
		_ = cl.Close()
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			t.Fatalf("%s after the stall: %v\n%s", s.Addr, err, info)
		}
	}
	cc := c.Client(t)
	if err := cc.Set(ctx, "{stall}k", "v", 0).Err(); err != nil {
		t.Fatalf("SET on the stalled master once it runs again: %v", err)
	}
}

// infoOf returns the INFO section of s.
func infoOf(t *testing.T, s *Server, section string) string {
	t.Helper()
	cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	defer cl.Close()
	info, err := cl.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	return info
}
