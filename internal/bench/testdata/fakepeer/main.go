// Command fakepeer stands in for the peer's cycler in internal/bench's
// tests: each cycle is one Redis SET, and it speaks the cycler protocol
// (internal/bench/peer.go).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("redis-addr", "", "")
	prefix := flag.String("prefix", "", "")
	conc := flag.Int("concurrency", 1, "")
	warmup := flag.Duration("warmup", 0, "")
	window := flag.Duration("duration", time.Second, "")
	count := flag.Int64("count", 0, "")
	flag.Parse()
	var seq, calls atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	if *count > 0 {
		fmt.Println("start")
	}
	for range *conc {
		c, err := net.Dial("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		r := bufio.NewReader(c)
		wg.Go(func() {
			for !stop.Load() {
				n := seq.Add(1)
				if *count > 0 && n > *count {
					return
				}
				key := fmt.Sprintf("%s%d", *prefix, n)
				fmt.Fprintf(c, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n", len(key), key)
				if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
					fmt.Fprintln(os.Stderr, "SET:", line, err)
					os.Exit(1)
				}
				calls.Add(1)
			}
		})
	}
	from, start := int64(0), time.Now()
	if *count == 0 {
		time.Sleep(*warmup)
		fmt.Println("start")
		from, start = calls.Load(), time.Now()
		time.Sleep(*window)
		stop.Store(true)
	}
	wg.Wait()
	fmt.Println("end", calls.Load()-from, 0, int64(time.Since(start)))
}
