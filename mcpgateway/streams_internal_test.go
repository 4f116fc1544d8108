package mcpgateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestEventStreamsPrimed: a GET's event stream starts with a priming
// event whose id, sent back, reaches the upstream as the last event id
// the request carried (none when it carried none); a GET refused with 405
// reads as an empty stream until the request ends; other answers, and
// the last event ids of other requests, pass as they are.
func TestEventStreamsPrimed(t *testing.T) {
	const stream = ": ok\n\nid: s:8\ndata: {}\n\n"
	for _, tc := range []struct {
		name, method, last string
		status             int
		contentType        string
		sent               string // the Last-Event-ID the upstream got
		primed             bool
		held               bool // the upstream's answer is left out: an empty stream, held until the request ends
	}{
		{name: "a new stream", method: http.MethodGet, status: 200, contentType: "text/event-stream", primed: true},
		{name: "resumed", method: http.MethodGet, last: "s:7", status: 200, contentType: "text/event-stream", sent: "s:7", primed: true},
		{name: "resumed after a priming event", method: http.MethodGet, last: primePrefix + "4:s:7", status: 200, contentType: "text/event-stream; charset=utf-8", sent: "s:7", primed: true},
		{name: "new after a priming event", method: http.MethodGet, last: primePrefix + "4:", status: 200, contentType: "text/event-stream", primed: true},
		{name: "no stream offered", method: http.MethodGet, last: "s:7", status: 405, contentType: "text/plain", sent: "s:7", primed: true, held: true},
		{name: "not a stream", method: http.MethodGet, status: 200, contentType: "application/json"},
		{name: "a POST's stream", method: http.MethodPost, status: 200, contentType: "text/event-stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sent string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sent = r.Header.Get("Last-Event-ID")
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, stream)
			}))
			defer srv.Close()
			c := &http.Client{Transport: headers{next: http.DefaultTransport}}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, tc.method, srv.URL, nil)
			if tc.last != "" {
				req.Header.Set("Last-Event-ID", tc.last)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if tc.held != errors.Is(err, context.DeadlineExceeded) || !tc.held && err != nil || sent != tc.sent {
				t.Fatalf("the upstream got Last-Event-ID %q (read: %v), want %q", sent, err, tc.sent)
			}
			want := stream
			if tc.held {
				want = ""
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("a stream refused with 405 is answered %d, want 200", resp.StatusCode)
				}
			}
			prime, rest, _ := strings.Cut(string(body), "\n\n")
			id, ok := strings.CutPrefix(prime, "id: ")
			if !tc.primed {
				if string(body) != stream {
					t.Fatalf("the answer reads %q, want %q", body, stream)
				}
				return
			}
			if !ok || !strings.HasSuffix(id, "\ndata:") || rest != want {
				t.Fatalf("the answer reads %q, want a priming event, then %q", body, want)
			}
			h := http.Header{"Last-Event-Id": {strings.TrimSuffix(id, "\ndata:")}}
			if unprime(h); h.Get("Last-Event-ID") != tc.sent {
				t.Errorf("the priming event's id %q goes back as %q, want %q", id, h.Get("Last-Event-ID"), tc.sent)
			}
		})
	}
}
