package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"testing"
	"time"
)

// Refused connections are logged at most once every refusalLogEvery, each
// line with the count since the previous one, and none with an address: a
// client reconnecting in a loop does not flood the log.
func TestRefusalsLoggedAtMostEveryInterval(t *testing.T) {
	var out bytes.Buffer
	c := ConnectionLimits{MaxConnections: 1}.counter(slog.New(slog.NewJSONHandler(&out, nil)))
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := start
	c.lines.now = func() time.Time { return at }
	if !c.admit() {
		t.Fatal("the first connection was refused")
	}
	refuse := func(after time.Duration) {
		at = start.Add(after)
		if c.admit() {
			t.Fatalf("a connection over the limit was admitted (at +%s)", after)
		}
		a, b := net.Pipe()
		defer b.Close()
		c.refuse(a)
	}
	refuse(0)
	refuse(time.Second)
	refuse(refusalLogEvery - time.Millisecond)
	refuse(refusalLogEvery)
	refuse(refusalLogEvery + time.Second)

	var counts []float64
	for _, line := range bytes.Split(bytes.TrimSpace(out.Bytes()), []byte("\n")) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if len(rec) != 5 { // time, level, msg, max_connections, refused
			t.Errorf("log line with other fields than the counts: %s", line)
		}
		counts = append(counts, rec["refused"].(float64))
	}
	if len(counts) != 2 || counts[0] != 1 || counts[1] != 3 {
		t.Errorf("refused counts logged %v, want [1 3] (one line per %s)", counts, refusalLogEvery)
	}
	if got := c.stats(); got.Refused != 5 || got.Open != 1 {
		t.Errorf("%+v, want 5 refused and 1 open", got)
	}
}
