package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

	dir  string   // the nodes' directories are under it
	args []string // every node's options
}

// StartCluster starts a Redis Cluster with the given number of masters and
// replicas per master (cluster-enabled, a 1s node timeout so a failover is
// quick), creates it with redis-cli --cluster create, waits until every node
// reports cluster_state:ok and every replica is in sync and known to every
// node as its master's (WaitReplicas), and stops it at the test's end. Extra
// args go to every node.
func StartCluster(tb testing.TB, masters, replicas int, args ...string) *Cluster {
	tb.Helper()
	skipShort(tb, "a Redis Cluster")
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
	c := &Cluster{dir: dir, args: append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"}, args...)}
	n := masters * (1 + replicas)
	for range n {
		if _, err := c.startNode(); err != nil {
			c.Stop()
			return nil, err
		}
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

// startNode starts one more node, with the cluster's options in a
// directory of its own, and adds it to Nodes.
func (c *Cluster) startNode() (*Server, error) {
	d := filepath.Join(c.dir, fmt.Sprintf("node%d", len(c.Nodes)))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	s, err := start(d, c.args)
	if err != nil {
		return nil, err
	}
	c.Nodes = append(c.Nodes, s)
	return s, nil
}

// AddMaster starts a node with the cluster's options, has it meet the
// cluster (CLUSTER MEET) and waits until every node knows it: a master
// serving no slot yet, which slots can then be moved to (as redis-cli
// --cluster add-node does), and until every node reports cluster_state:ok.
// It is stopped with the cluster.
func (c *Cluster) AddMaster(tb testing.TB) *Server {
	tb.Helper()
	s := c.meetNode(tb)
	// The new node answers CLUSTERDOWN until it has the slot map.
	if err := c.waitOK(30 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return s
}

// AddReplica starts a node with the cluster's options, has it meet the
// cluster, makes it a replica of master (CLUSTER REPLICATE, as redis-cli
// --cluster add-node --cluster-slave does) and waits until master has it
// online and every node reports cluster_state:ok. It is stopped with the
// cluster.
func (c *Cluster) AddReplica(tb testing.TB, master *Server) *Server {
	tb.Helper()
	s := c.meetNode(tb)
	masterID := NodeID(tb, master)
	cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	defer cl.Close()
	// The node may not have learnt yet that master is a master.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cl.Do(context.Background(), "cluster", "replicate", masterID).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("CLUSTER REPLICATE %s on %s: %v", master.Addr, s.Addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mc := redis.NewClient(&redis.Options{Addr: master.Addr, DisableIdentity: true})
	defer mc.Close()
	_, port, _ := strings.Cut(s.Addr, ":")
	for {
		info, err := mc.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "port="+port+",state=online") {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("replica %s of %s did not come in sync within 30s", s.Addr, master.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.waitOK(30 * time.Second); err != nil {
		tb.Fatal(err)
	}
	return s
}

// meetNode starts a node with the cluster's options, has it meet the
// cluster (CLUSTER MEET) and waits until every node knows it.
func (c *Cluster) meetNode(tb testing.TB) *Server {
	tb.Helper()
	s, err := c.startNode()
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	host, port, _ := strings.Cut(s.Addr, ":")
	first := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr, DisableIdentity: true})
	defer first.Close()
	if err := first.ClusterMeet(ctx, host, port).Err(); err != nil {
		tb.Fatalf("CLUSTER MEET %s: %v", s.Addr, err)
	}
	id := NodeID(tb, s)
	deadline := time.Now().Add(30 * time.Second)
	for {
		known := 0
		for _, n := range c.Nodes {
			if !n.Running() {
				known++
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: n.Addr, DisableIdentity: true, MaxRetries: -1})
			nodes, err := cl.ClusterNodes(ctx).Result()
			_ = cl.Close()
			if err == nil && strings.Count(nodes, "\n") == len(c.Nodes) && strings.Contains(nodes, id) {
				known++
			}
		}
		if known == len(c.Nodes) {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the cluster did not learn of the new master %s within 30s", s.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return s
}

// NodeID returns the cluster node id of s (CLUSTER MYID).
func NodeID(tb testing.TB, s *Server) string {
	tb.Helper()
	cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	defer cl.Close()
	id, err := cl.Do(context.Background(), "cluster", "myid").Text()
	if err != nil {
		tb.Fatalf("CLUSTER MYID of %s: %v", s.Addr, err)
	}
	return id
}

// waitReplicas waits until the given number of masters each have their
// replicas connected and in sync, and until every running node knows those
// replicas as that master's (CLUSTER NODES). The replication link comes up
// before the cluster bus has told every node of the new role, and a
// failover needs the nodes to know it: a master ignores a manual failover
// request (CLUSTER FAILOVER) from a node it does not know as its replica,
// and the masters vote only for a replica of the failed master.
func (c *Cluster) waitReplicas(masters, replicas int, timeout time.Duration) error {
	if replicas == 0 {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		synced, known := 0, true
		for _, s := range c.Nodes {
			if !s.Running() {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
			info, err := cl.Info(context.Background(), "replication").Result()
			var id string
			if err == nil {
				id, err = cl.Do(context.Background(), "cluster", "myid").Text()
			}
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "role:master") {
				continue
			}
			online := onlineReplicas(info)
			if len(online) >= replicas {
				synced++
				known = known && c.knownAsReplicas(id, online)
			}
		}
		if synced >= masters && known {
			return nil
		}
		if time.Now().After(deadline) {
			if synced >= masters {
				return errors.New("the cluster's replicas came in sync, but not every node knows them as replicas")
			}
			return errors.New("the cluster's replicas did not come in sync")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// onlineReplicas returns the addresses (host:port) of the replicas a
// master's INFO replication shows online.
func onlineReplicas(info string) []string {
	var addrs []string
	for _, line := range strings.Split(info, "\n") {
		_, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(line, "slave") || !strings.Contains(v, "state=online") {
			continue
		}
		var ip, port string
		for _, kv := range strings.Split(v, ",") {
			switch k, v, _ := strings.Cut(kv, "="); k {
			case "ip":
				ip = v
			case "port":
				port = v
			}
		}
		addrs = append(addrs, net.JoinHostPort(ip, port))
	}
	return addrs
}

// knownAsReplicas reports whether every running node's CLUSTER NODES lists
// each of addrs as a replica of the master whose node id is master.
func (c *Cluster) knownAsReplicas(master string, addrs []string) bool {
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		cl := redis.NewClient(&redis.Options{Addr: n.Addr, DisableIdentity: true, MaxRetries: -1})
		nodes, err := cl.ClusterNodes(context.Background()).Result()
		_ = cl.Close()
		if err != nil {
			return false
		}
		for _, addr := range addrs {
			found := false
			for _, line := range strings.Split(nodes, "\n") {
				// <id> <ip:port@cport[,hostname]> <flags> <master id> ...
				f := strings.Fields(line)
				if len(f) > 3 && strings.HasPrefix(f[1], addr+"@") {
					found = slices.Contains(strings.Split(f[2], ","), "slave") && f[3] == master
					break
				}
			}
			if !found {
				return false
			}
		}
	}
	return true
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
// replicas online, known to every node as that master's replicas.
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

// sharedClusterArgs are the shared cluster's options besides StartCluster's:
// a node timeout longer than any test run. The shared cluster is for tests
// of a cluster that keeps its shape; with StartCluster's 1s, a node stalled
// for a second on a busy machine (a redis-server not scheduled, or slow to
// answer the cluster bus) is marked failing, the others fail it over to its
// replica, and it answers CLUSTERDOWN meanwhile: tests that share the
// cluster would fail for a failover they never asked for.
// skipShort skips a test that needs what under -short (make check, the
// inner loop); make test runs it.
func skipShort(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skipf("-short: no %s", what)
	}
}

var sharedClusterArgs = []string{"--cluster-node-timeout", "600000"}

// SharedCluster returns a 3-master Redis Cluster (one replica each) shared
// by the test binary, started on first use and stopped by Main. Its nodes
// are never failed over: a test that needs a failover starts a cluster of
// its own (StartCluster).
func SharedCluster(tb testing.TB) *Cluster {
	tb.Helper()
	skipShort(tb, "a Redis Cluster")
	sharedClusterOnce.Do(func() {
		sharedClusterDir, sharedClusterErr = os.MkdirTemp("", "redistest-cluster-")
		if sharedClusterErr == nil {
			sharedCluster, sharedClusterErr = startCluster(sharedClusterDir, 3, 1, sharedClusterArgs)
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
