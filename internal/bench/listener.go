package bench

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// listenerOwner tells whether process pid holds the listening TCP socket on
// addr's port. A server that could not bind its port may still be starting
// or exiting when another process's server answers there, so an answer on
// the port does not prove the server is ours; the socket's owner does.
// known is false when this cannot be told (no /proc, as off Linux).
func listenerOwner(pid int, addr string) (owns, known bool, err error) {
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return false, true, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return false, true, fmt.Errorf("port of %q: %w", addr, err)
	}
	inodes := map[string]bool{}
	read := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		read++
		listeningInodes(f, uint16(port), inodes)
		_ = f.Close()
	}
	if read == 0 {
		return false, false, nil
	}
	fdDir := "/proc/" + strconv.Itoa(pid) + "/fd"
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false, true, err
	}
	for _, fd := range fds {
		target, err := os.Readlink(fdDir + "/" + fd.Name())
		if err != nil {
			continue // closed since the listing
		}
		if inode, ok := strings.CutPrefix(target, "socket:["); ok && inodes[strings.TrimSuffix(inode, "]")] {
			return true, true, nil
		}
	}
	return false, true, nil
}

// listeningInodes adds to inodes the socket inodes that listen on port in a
// /proc/net/tcp or tcp6 table (local address "ADDR:PORT" in hex, state 0A
// for LISTEN, the inode in the tenth column), whatever address they bind.
func listeningInodes(f *os.File, port uint16, inodes map[string]bool) {
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" || !strings.HasSuffix(fields[1], want) {
			continue
		}
		inodes[fields[9]] = true
	}
}
