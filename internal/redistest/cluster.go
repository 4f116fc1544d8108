package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of real redis-server processes on loopback.
type Cluster struct {
	// Nodes are every node, masters first as created (their roles change
	// after a failover: see Masters).
	Nodes []*Server
}

// StartCluster starts a Redis Cluster with the given number of masters and
// replicas per master (cluster-enabled, a 1s node timeout so a failover is
// quick), creates it with redis-cli --cluster create, waits until every node
// reports cluster_state:ok, and stops it at the test's end. Extra args go to
// every node.
func StartCluster(tb testing.TB, masters, replicas int, args ...string) *Cluster {
	tb.Helper()
	c, err := startCluster(tb.TempDir(), masters, replicas, args)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Stop)
	return c
}

func startCluster(dir string, masters, replicas int, args []string) (*Cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, errors.New("redis-cli not found on PATH: it comes with Debian's redis-server (package redis-tools)")
	}
	c := &Cluster{}
	n := masters * (1 + replicas)
	for i := range n {
		d := filepath.Join(dir, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		s, err := start(d, append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"}, args...))
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	create := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		create = append(create, s.Addr)
	}
	create = append(create, "--cluster-replicas", fmt.Sprint(replicas), "--cluster-yes")
	if out, err := exec.Command(cli, create...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, lastLine(string(out)))
	}
	if err := c.waitOK(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	if err := c.waitReplicas(masters, replicas, 30*time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// waitReplicas waits until the given number of masters each have their
// replicas connected and in sync.
func (c *Cluster) waitReplicas(masters, replicas int, timeout time.Duration) error {
	if replicas == 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		synced := 0
		for _, s := range c.Nodes {
			cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
			info, err := cl.Info(context.Background(), "replication").Result()
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "role:master") {
				continue
			}
			online := strings.Count(info, "state=online")
			if online >= replicas {
				synced++
			}
		}
		if synced >= masters {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the cluster's replicas did not come in sync")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitOK waits until every running node reports cluster_state:ok and agrees
// on the slots.
func (c *Cluster) waitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok := true
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
			info, err := cl.ClusterInfo(context.Background()).Result()
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the cluster did not reach cluster_state:ok")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Addrs returns the addresses of every node.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, s := range c.Nodes {
		out = append(out, s.Addr)
	}
	return out
}

// Client returns a cluster client, closed at the test's end.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DisableIdentity: true})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

// MasterFor returns the node that is master of key's slot now.
func (c *Cluster) MasterFor(tb testing.TB, key string) *Server {
	tb.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DisableIdentity: true})
	defer cc.Close()
	node, err := cc.MasterForKey(context.Background(), key)
	if err != nil {
		tb.Fatal(err)
	}
	addr := node.Options().Addr
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	tb.Fatalf("no node at %s", addr)
	return nil
}

// WaitFailover waits, after the master dead was killed, until the other
// nodes have marked it failed (a replica took its slots) and the cluster is
// ok again. (Right after the kill the survivors still report ok: they only
// notice after the node timeout.)
func (c *Cluster) WaitFailover(tb testing.TB, dead *Server) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		failed := false
		for _, s := range c.Nodes {
			if s == dead || !s.Running() {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
			nodes, err := cl.ClusterNodes(context.Background()).Result()
			_ = cl.Close()
			for _, line := range strings.Split(nodes, "\n") {
				f := strings.Fields(line)
				if err == nil && len(f) > 2 && strings.HasPrefix(f[1], dead.Addr) && strings.Contains(f[2], "fail") && !strings.Contains(f[2], "fail?") {
					failed = true
				}
			}
			break
		}
		if failed && c.waitOK(time.Second) == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatal("no failover within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitOK waits until every running node reports cluster_state:ok.
func (c *Cluster) WaitOK(tb testing.TB) {
	tb.Helper()
	if err := c.waitOK(30 * time.Second); err != nil {
		tb.Fatal(err)
	}
}

// WaitReplicas waits until the given number of masters each have that many
// replicas online.
func (c *Cluster) WaitReplicas(tb testing.TB, masters, replicas int) {
	tb.Helper()
	if err := c.waitReplicas(masters, replicas, 30*time.Second); err != nil {
		tb.Fatal(err)
	}
}

// Stop kills every node.
func (c *Cluster) Stop() {
	var wg sync.WaitGroup
	for _, s := range c.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); s.Stop() }()
	}
	wg.Wait()
}

var (
	sharedClusterOnce sync.Once
	sharedCluster     *Cluster
	sharedClusterErr  error
	sharedClusterDir  string
)

// SharedCluster returns a 3-master Redis Cluster (one replica each) shared
// by the test binary, started on first use and stopped by Main.
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	sharedClusterOnce.Do(func() {
		sharedClusterDir, sharedClusterErr = os.MkdirTemp("", "redistest-cluster-")
		if sharedClusterErr == nil {
			sharedCluster, sharedClusterErr = startCluster(sharedClusterDir, 3, 1, nil)
		}
	})
	if sharedClusterErr != nil {
		tb.Fatal(sharedClusterErr)
	}
	return sharedCluster
}

func stopSharedCluster() {
	if sharedCluster != nil {
		sharedCluster.Stop()
	}
	if sharedClusterDir != "" {
		_ = os.RemoveAll(sharedClusterDir)
	}
}
