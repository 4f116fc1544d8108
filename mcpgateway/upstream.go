package mcpgateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
)

// upstream is one MCP server behind the gateway, and the session to it.
type upstream struct {
	cfg    UpstreamConfig
	g      *Gateway
	client *mcp.Client
	http   *http.Client // a URL upstream's, shared by its sessions

	mu     sync.Mutex
	sess   *mcp.ClientSession
	closed chan struct{} // closed when sess ends

	// changed holds one notice that the upstream's tools changed, for
	// the next listing; more notices before it starts add nothing.
	changed chan struct{}
	// listing lets one listing at a time be served, and guards outputs.
	listing sync.Mutex
	outputs outputs
	// progress passes this upstream's progress notifications on, and no
	// other upstream's.
	progress progressRelay
}

func newUpstream(g *Gateway, cfg UpstreamConfig) *upstream {
	u := &upstream{cfg: cfg, g: g, changed: make(chan struct{}, 1), outputs: newOutputs()}
	if cfg.URL != "" {
		u.http = &http.Client{Transport: headers{h: cfg.Headers, next: pooled()}}
	}
	u.client = mcp.NewClient(&mcp.Implementation{Name: "ledgermcp", Version: Version}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case u.changed <- struct{}{}:
			default:
			}
		},
		ProgressNotificationHandler: func(ctx context.Context, req *mcp.ProgressNotificationClientRequest) {
			u.progress.deliver(ctx, req.Params)
		},
	})
	return u
}

// session returns a live session, connecting when there is none, and the
// channel closed when it ends. An error means the call was not sent.
func (u *upstream) session(ctx context.Context) (*mcp.ClientSession, <-chan struct{}, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.live() {
		return u.sess, u.closed, nil
	}
	u.sess = nil
	cs, err := u.client.Connect(ctx, u.transport(), nil)
	if err != nil {
		return nil, nil, &unreachableError{upstream: u.cfg.Name, err: hideURLs(err)}
	}
	closed := make(chan struct{})
	go func() {
		_ = cs.Wait()
		close(closed)
	}()
	u.sess, u.closed = cs, closed
	return cs, closed, nil
}

// keep holds a session to the upstream and its tools served until ctx
// ends: it connects, lists the tools, waits for the session to end, and
// starts again, backing off while the upstream cannot be reached.
func (u *upstream) keep(ctx context.Context, ready func()) {
	relisted := make(chan struct{})
	go func() {
		defer close(relisted)
		u.relist(ctx)
	}()
	defer func() { <-relisted }()
	wait := time.Second
	for ctx.Err() == nil {
		closed, err := u.sync(ctx)
		ready()
		if err != nil {
			msg := "upstream tools not listed"
			var ue *unreachableError
			if errors.As(err, &ue) {
				msg = "upstream unreachable"
			}
			u.g.log.Warn(msg, "upstream", u.cfg.Name, "retry_in_ms", wait.Milliseconds(), "error", err)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
			wait = min(wait*2, 30*time.Second)
			continue
		}
		wait = time.Second
		select {
		case <-ctx.Done():
		case <-closed:
			u.g.log.Warn("upstream session ended", "upstream", u.cfg.Name)
		}
	}
}

// relist lists the upstream's tools again each time it says they
// changed, until ctx ends. Notices that come while a listing is on its
// way make one listing after it.
func (u *upstream) relist(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-u.changed:
		}
		if _, err := u.sync(ctx); err != nil && ctx.Err() == nil {
			u.g.log.Warn("listing an upstream's tools", "upstream", u.cfg.Name, "error", err)
		}
	}
}

// sync lists the upstream's tools and serves them in place of the ones
// served before, one listing at a time. It returns the channel closed
// when the session ends.
func (u *upstream) sync(ctx context.Context) (<-chan struct{}, error) {
	u.listing.Lock()
	defer u.listing.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cs, closed, err := u.session(ctx)
	if err != nil {
		return nil, err
	}
	tools, err := listTools(ctx, cs)
	if err != nil {
		return nil, hideURLs(err)
	}
	u.g.serve(u, tools)
	return closed, nil
}

// The most tools one upstream's listing may have, and the most pages.
const (
	maxTools = 10000
	maxPages = 1000
)

// listTools lists an upstream's tools, page by page. It refuses a listing
// of more than maxTools tools or maxPages pages: a cursor that never ends
// would list until the listing's timeout, holding every page.
func listTools(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.Tool, error) {
	params := &mcp.ListToolsParams{}
	var tools []*mcp.Tool
	for pages := 1; ; pages++ {
		res, err := cs.ListTools(ctx, params)
		if err != nil {
			return nil, err
		}
		tools = append(tools, res.Tools...)
		switch {
		case len(tools) > maxTools:
			return nil, fmt.Errorf("the upstream lists more than %d tools", maxTools)
		case res.NextCursor == "":
			return tools, nil
		case pages == maxPages:
			return nil, fmt.Errorf("the upstream lists its tools on more than %d pages", maxPages)
		}
		params.Cursor = res.NextCursor
	}
}

// transport connects to the upstream: its command over stdio, or its URL.
func (u *upstream) transport() mcp.Transport {
	if u.cfg.URL != "" {
		return &mcp.StreamableClientTransport{
			Endpoint:     u.cfg.URL,
			HTTPClient:   u.http,
			MaxEventSize: maxMessage,
		}
	}
	cmd := exec.Command(u.cfg.Command[0], u.cfg.Command[1:]...)
	cmd.Env = u.environment()
	cmd.Stderr = os.Stderr
	var logged atomic.Bool // the first dropped line of the session
	return &command{cmd: cmd, dropped: func(n int) {
		u.g.metrics.dropped.WithLabelValues(u.cfg.Name).Inc()
		if !logged.Swap(true) {
			u.g.log.Warn("upstream wrote a line that is no JSON-RPC message to stdout; dropped (more are counted, not logged)",
				"upstream", u.cfg.Name, "bytes", n)
		}
	}}
}

// maxMessage is the most an upstream's message may hold, in bytes: go-sdk's
// bound for a stdio line, kept for a URL upstream's events and JSON answers
// too. A longer one ends the upstream's session.
const maxMessage = mcp.DefaultMaxLineLength

// The pool of one URL upstream: how many idle connections the gateway
// keeps for its next calls, and for how long. Node's and uvicorn's
// servers close a connection idle for 5 s; a call sent on one just as
// the server closes it fails after it was sent, and is ambiguous. The
// gateway closes them first.
const (
	maxIdleConns = 100
	idleConnTime = 4 * time.Second
)

// pooled returns the transport of one URL upstream: the default one,
// keeping up to maxIdleConns idle connections instead of its 2 per host,
// so calls at once do not each dial a connection and close it, each for
// idleConnTime instead of its 90 s.
func pooled() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns, t.MaxIdleConnsPerHost = maxIdleConns, maxIdleConns
	t.IdleConnTimeout = idleConnTime
	return t
}

// environment is a command's: the gateway's own, without the variables
// holding ledger keys, and the configured env on top.
func (u *upstream) environment() []string {
	secret := map[string]bool{}
	for _, name := range append([]string{u.g.cfg.Ledger.APIKeyEnv}, u.g.cfg.Reconcile.APIKeyEnvs...) {
		secret[name] = true
	}
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if _, set := u.cfg.Env[name]; !secret[name] && !set {
			env = append(env, kv)
		}
	}
	for k, v := range u.cfg.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// headers is a URL upstream's transport: it adds the configured headers
// to every request to the upstream (see RoundTrip).
type headers struct {
	h    map[string]string
	next http.RoundTripper
}

// CloseIdleConnections closes the idle connections of the transport
// underneath, as http.Client.CloseIdleConnections asks.
func (t headers) CloseIdleConnections() {
	if c, ok := t.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip sends r with the headers, notes the status of the first POST
// made under a call's context (postStatus), and hands go-sdk the answer
// as answer makes it.
func (t headers) RoundTrip(r *http.Request) (*http.Response, error) {
	if len(t.h) > 0 || r.Method == http.MethodGet {
		r = r.Clone(r.Context())
		for k, v := range t.h {
			r.Header.Set(k, v)
		}
		unprime(r.Header)
	}
	resp, err := t.next.RoundTrip(r)
	if s, ok := r.Context().Value(postStatusKey{}).(*postStatus); ok && err == nil && r.Method == http.MethodPost {
		s.code.CompareAndSwap(0, int32(resp.StatusCode))
	}
	if err != nil {
		return nil, err
	}
	return answer(r, resp), nil
}

// answer is resp, the upstream's answer to r, as go-sdk can take it
// without ending the session for one request's sake: a GET refused with
// 405 becomes an empty event stream (noStream), a POST refused alone
// (refusedAlone) a JSON-RPC error, a JSON answer is read whole up to
// maxMessage (answerAlone); another answer but an event stream is bounded
// to maxMessage (go-sdk bounds each event), and a GET's event stream
// starts with a priming event (primed).
func answer(r *http.Request, resp *http.Response) *http.Response {
	if r.Method == http.MethodGet && resp.StatusCode == http.StatusMethodNotAllowed {
		resp.Body.Close()
		resp = noStream(r)
	}
	if r.Method == http.MethodPost && refusedAlone[resp.StatusCode] {
		resp.Body.Close()
		resp.Header.Set("Content-Type", "application/json")
		zero, _ := jsonrpc.MakeID(float64(0)) // go-sdk reads the error, not its id
		resp.Body = errorAnswer(zero, "HTTP "+strconv.Itoa(resp.StatusCode)+" "+http.StatusText(resp.StatusCode))
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case r.Method == http.MethodPost && mt == "application/json" && resp.StatusCode/100 == 2:
		resp.Body = answerAlone(r, resp.Body)
	case mt != "text/event-stream":
		resp.Body = &boundedBody{ReadCloser: resp.Body, left: maxMessage}
	case r.Method == http.MethodGet && resp.StatusCode == http.StatusOK:
		resp.Body = primed(resp.Body, r.Header.Get(lastEventID))
	}
	return resp
}

// answerAlone reads body, the JSON answer to the request r, whole, up to
// maxMessage. go-sdk ends the session at an answer it cannot read (longer,
// or cut off), and every call in flight on it; so such an answer to a
// request with an id is given as a JSON-RPC error to that request alone,
// which leaves its call unknown (its tool may have run). An answer to a
// request without one still fails its read.
func answerAlone(r *http.Request, body io.ReadCloser) io.ReadCloser {
	data, err := io.ReadAll(&boundedBody{ReadCloser: body, left: maxMessage})
	body.Close()
	if err == nil {
		return io.NopCloser(bytes.NewReader(data))
	}
	id, ok := requestID(r)
	if !ok {
		return io.NopCloser(failedRead{err})
	}
	return errorAnswer(id, err.Error())
}

// errorAnswer is a body holding a JSON-RPC error answering the request
// id, with msg.
func errorAnswer(id jsonrpc.ID, msg string) io.ReadCloser {
	b, _ := jsonrpc.EncodeMessage(&jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: msg}})
	return io.NopCloser(bytes.NewReader(b))
}

// failedRead is a body whose read fails with err.
type failedRead struct{ err error }

func (f failedRead) Read([]byte) (int, error) { return 0, f.err }

// requestID is the id of the JSON-RPC request r sends; false when it sends
// none.
func requestID(r *http.Request) (jsonrpc.ID, bool) {
	if r.GetBody == nil {
		return jsonrpc.ID{}, false
	}
	b, err := r.GetBody()
	if err != nil {
		return jsonrpc.ID{}, false
	}
	data, err := io.ReadAll(io.LimitReader(b, maxMessage))
	if err != nil {
		return jsonrpc.ID{}, false
	}
	msg, err := jsonrpc.DecodeMessage(data)
	req, ok := msg.(*jsonrpc.Request)
	if err != nil || !ok || !req.ID.IsValid() {
		return jsonrpc.ID{}, false
	}
	return req.ID, true
}

// boundedBody fails a read once more than left bytes arrived.
type boundedBody struct {
	io.ReadCloser
	left int64
}

// errTooLarge is a URL upstream's answer longer than maxMessage.
var errTooLarge = fmt.Errorf("the answer exceeded %d bytes", maxMessage)

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, errTooLarge
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	if b.left -= int64(n); b.left < 0 {
		return 0, errTooLarge
	}
	return n, err
}

// call forwards a tool call. Its error is classified for the ledger
// (client.ClassOf): retryable when the call was not sent or the upstream
// refused it before running the tool, ambiguous otherwise.
func (u *upstream) call(ctx context.Context, p *mcp.CallToolParams, progress func(context.Context, *mcp.ProgressNotificationParams)) (*mcp.CallToolResult, error) {
	cs, _, err := u.session(ctx)
	if err != nil {
		return nil, client.MarkRetryable(err)
	}
	if progress != nil {
		tok, done := u.progress.add(progress)
		defer done()
		p.SetProgressToken(tok)
	}
	var status postStatus
	res, err := cs.CallTool(status.in(ctx), copyParams(p))
	if errors.Is(err, mcp.ErrSessionMissing) || status.code.Load() == http.StatusBadRequest {
		// The upstream answered 404 for its session (it restarted), or
		// 400, as servers written from older SDK examples answer a session
		// they do not hold (go-sdk ends the session then): the call was
		// not processed, so it goes again on a new session, once.
		u.drop(cs)
		if cs, _, err = u.session(ctx); err != nil {
			return nil, client.MarkRetryable(err)
		}
		status = postStatus{}
		res, err = cs.CallTool(status.in(ctx), copyParams(p))
	}
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
		u.drop(cs)
	}
	if err != nil {
		return nil, classify(hideURLs(err), int(status.code.Load()))
	}
	return res, nil
}

// hideURLs returns err, its text with each URL cut to its scheme and host
// (see cutURLs); nil when err is nil.
func hideURLs(err error) error {
	if err == nil {
		return nil
	}
	return &urlsHidden{err}
}

// urlsHidden is an upstream's error without the paths and queries of
// the URLs it quotes: hosted MCP servers take keys there, and errors are
// logged.
type urlsHidden struct{ err error }

func (e *urlsHidden) Error() string { return cutURLs(e.err.Error()) }

func (e *urlsHidden) Unwrap() error { return e.err }

// cutURLs returns s with each http or https URL in it, up to a quote or
// white space, cut to its scheme and host, followed by "/…" where
// something was cut.
func cutURLs(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "http://")
		if j := strings.Index(s, "https://"); j >= 0 && (i < 0 || j < i) {
			i = j
		}
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		n := strings.IndexAny(s[i:], "\"' \t\r\n")
		if n < 0 {
			n = len(s) - i
		}
		b.WriteString(s[:i])
		raw := s[i : i+n]
		scheme, rest, _ := strings.Cut(raw, "://")
		host, _, _ := strings.Cut(rest, "/")
		host, _, _ = strings.Cut(host, "?")
		host, _, _ = strings.Cut(host, "#")
		if at := strings.LastIndex(host, "@"); at >= 0 {
			host = host[at+1:]
		}
		b.WriteString(scheme + "://" + host)
		if scheme+"://"+host != raw {
			b.WriteString("/…")
		}
		s = s[i+n:]
	}
}

// postStatus holds the HTTP status a URL upstream answered a call's POST
// with, as headers.RoundTrip sees it (0: none yet, or a command upstream).
type postStatus struct{ code atomic.Int32 }

type postStatusKey struct{}

// in returns ctx carrying s, for the requests made under it.
func (s *postStatus) in(ctx context.Context) context.Context {
	return context.WithValue(ctx, postStatusKey{}, s)
}

// refusedAlone are the statuses of notProcessed with which a server, or a
// proxy or firewall on the way, refuses one request, not the session (400
// and 404 may say the session is gone, 401 that its credentials are;
// go-sdk takes 429 for a passing refusal itself). go-sdk ends the session
// at any other status without a JSON-RPC error in its body, and every
// call in flight on it, so RoundTrip gives it one: the request alone
// fails.
var refusedAlone = map[int]bool{
	http.StatusForbidden: true, http.StatusMethodNotAllowed: true, http.StatusNotAcceptable: true,
	http.StatusRequestTimeout: true, http.StatusRequestEntityTooLarge: true, http.StatusRequestURITooLong: true,
	http.StatusUnsupportedMediaType: true, http.StatusTooEarly: true, http.StatusRequestHeaderFieldsTooLarge: true,
}

// notProcessed are the HTTP statuses with which a server says it did not
// process a request (docs/mcp.md): a call answered so is retryable. Any
// other, a 5xx among them, proves nothing.
var notProcessed = map[int]bool{
	http.StatusBadRequest: true, http.StatusUnauthorized: true, http.StatusForbidden: true,
	http.StatusNotFound: true, http.StatusMethodNotAllowed: true, http.StatusNotAcceptable: true,
	http.StatusRequestTimeout: true, http.StatusRequestEntityTooLarge: true, http.StatusRequestURITooLong: true,
	http.StatusUnsupportedMediaType: true, http.StatusTooEarly: true, http.StatusTooManyRequests: true,
	http.StatusRequestHeaderFieldsTooLarge: true,
}

// copyParams is p for one send: the SDK writes to a call's _meta.
func copyParams(p *mcp.CallToolParams) *mcp.CallToolParams {
	c := *p
	c.Meta = maps.Clone(p.Meta)
	return &c
}

// drop forgets the session cs, which ended, so the next call connects.
func (u *upstream) drop(cs *mcp.ClientSession) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.sess == cs {
		u.sess = nil
	}
}

// connected reports whether the upstream holds a session that has not
// ended.
func (u *upstream) connected() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.live()
}

// live is connected with u.mu held.
func (u *upstream) live() bool {
	if u.sess == nil {
		return false
	}
	select {
	case <-u.closed:
		return false
	default:
		return true
	}
}

// classify marks an upstream's error, its call's POST answered with
// status (0: none): a refused connection, a JSON-RPC refusal of the
// request (unknown method or tool, invalid params), a 404 for the session
// or another status of notProcessed prove the tool did not run; anything
// else may come after it ran.
func classify(err error, status int) error {
	var we *jsonrpc.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return client.MarkRetryable(err)
	case errors.As(err, &we) && (we.Code == jsonrpc.CodeMethodNotFound || we.Code == jsonrpc.CodeInvalidParams):
		return client.MarkRetryable(&refusedError{msg: we.Message})
	case notProcessed[status]:
		return client.MarkRetryable(&refusedError{msg: "HTTP " + strconv.Itoa(status) + " " + http.StatusText(status)})
	case errors.Is(err, mcp.ErrSessionMissing):
		return client.MarkRetryable(&unreachableError{upstream: "(its session is gone)", err: err})
	}
	return client.MarkAmbiguous(err)
}

// unreachableError is an upstream the gateway could not connect to: no
// call was sent.
type unreachableError struct {
	upstream string
	err      error
}

func (e *unreachableError) Error() string {
	return "connecting to upstream " + e.upstream + ": " + e.err.Error()
}

func (e *unreachableError) Unwrap() error { return e.err }

// refusedError is an upstream's refusal of a call before the tool ran.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return "the tool server refused the call: " + e.msg }

// close ends the session, stopping a command, and closes the idle
// connections of a URL upstream.
func (u *upstream) close() {
	u.mu.Lock()
	cs := u.sess
	u.sess = nil
	u.mu.Unlock()
	if cs != nil {
		_ = cs.Close()
	}
	if u.http != nil {
		u.http.CloseIdleConnections()
	}
}

// progressRelay passes an upstream's progress notifications on to the
// callers that asked for them, under the callers' own tokens.
type progressRelay struct {
	next atomic.Int64
	m    sync.Map // gateway token -> func
}

func (r *progressRelay) add(f func(context.Context, *mcp.ProgressNotificationParams)) (string, func()) {
	tok := "ledgermcp-" + strconv.FormatInt(r.next.Add(1), 10)
	r.m.Store(tok, f)
	return tok, func() { r.m.Delete(tok) }
}

func (r *progressRelay) deliver(ctx context.Context, p *mcp.ProgressNotificationParams) {
	tok, _ := p.ProgressToken.(string)
	if f, ok := r.m.Load(tok); ok {
		f.(func(context.Context, *mcp.ProgressNotificationParams))(ctx, p)
	}
}

// rawArguments is a call's arguments as the upstream gets them.
func rawArguments(raw json.RawMessage) any {
	if len(raw) == 0 || string(raw) == "null" {
		return map[string]any{}
	}
	return raw
}
