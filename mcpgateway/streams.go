package mcpgateway

import (
	"context"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// go-sdk ends a Streamable HTTP session when the GET event stream it holds
// for server messages has ended 6 times in a row without a new event id,
// and with it every call in flight on the session. Servers, and proxies on
// the way, end idle streams. So each such stream the gateway reads (from
// an upstream) or writes (to its own clients) starts with a priming event,
// an id and no data, which go-sdk counts as a new id and otherwise passes
// over; the priming id a client sends back asking for the stream again is
// taken out before the stream's server sees it (docs/mcp.md).

// lastEventID is the header with which a client resumes an event stream.
const lastEventID = "Last-Event-ID"

// primePrefix starts the id of a priming event. The id goes on with a
// number of its own and a colon, then the server's last event id, if any.
const primePrefix = "ledgermcp-prime."

// primes numbers the priming events.
var primes atomic.Uint64

// primeEvent is a new priming event that carries last, the server's last
// event id.
func primeEvent(last string) string {
	return "id: " + primePrefix + strconv.FormatUint(primes.Add(1), 10) + ":" + last + "\ndata:\n\n"
}

// primed starts body, an upstream's event stream answering a GET sent with
// the upstream's last event id last, with a priming event.
func primed(body io.ReadCloser, last string) io.ReadCloser {
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(strings.NewReader(primeEvent(last)), body), body}
}

// unprime puts back in h the server's last event id where a client sends
// a priming event's (or leaves none, when the server had sent none).
func unprime(h http.Header) {
	rest, ok := strings.CutPrefix(h.Get(lastEventID), primePrefix)
	if !ok {
		return
	}
	if _, last, _ := strings.Cut(rest, ":"); last != "" {
		h.Set(lastEventID, last)
	} else {
		h.Del(lastEventID)
	}
}

// primeStreams serves a GET with next, starting the event stream it
// answers with a priming event. The gateway's streams have no ids of
// their own (it keeps no event store), so a priming id sent back is
// taken out.
func primeStreams(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			r = r.Clone(r.Context())
			unprime(r.Header)
			w = &primingWriter{ResponseWriter: w}
		}
		next.ServeHTTP(w, r)
	})
}

// primingWriter writes a priming event first in an event stream answered
// 200.
type primingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *primingWriter) WriteHeader(code int) {
	w.ResponseWriter.WriteHeader(code)
	if w.wrote {
		return
	}
	w.wrote = true
	if mt, _, _ := mime.ParseMediaType(w.Header().Get("Content-Type")); code == http.StatusOK && mt == "text/event-stream" {
		_, _ = io.WriteString(w.ResponseWriter, primeEvent(""))
	}
}

func (w *primingWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController flush the stream.
func (w *primingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// noStream answers r, a GET the upstream refused with 405 (it offers no
// event stream), with an event stream that stays empty until r ends
// (when the session does, or r's call). go-sdk ends the session at a 405
// to a stream it asks for again, and every call in flight on it.
func noStream(r *http.Request) *http.Response {
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  http.Header{"Content-Type": {"text/event-stream"}},
		Body:    &emptyStream{ctx: r.Context(), closed: make(chan struct{})},
		Request: r,
	}
}

// emptyStream is a body that holds nothing, and whose reads end when ctx
// does or it is closed.
type emptyStream struct {
	ctx    context.Context
	once   sync.Once
	closed chan struct{}
}

func (e *emptyStream) Read([]byte) (int, error) {
	select {
	case <-e.ctx.Done():
		return 0, e.ctx.Err()
	case <-e.closed:
		return 0, io.EOF
	}
}

func (e *emptyStream) Close() error {
	e.once.Do(func() { close(e.closed) })
	return nil
}
