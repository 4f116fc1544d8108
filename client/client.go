// Package client is what Go agent runtimes import to make side-effecting tool
// calls safe to retry through the operation ledger.
//
// Do is the one call that does the whole protocol:
//
//	res, err := c.Do(ctx, client.Op{
//		ID: runID + ":" + callID, Tool: "payments.refund",
//		Params: map[string]any{"charge": "ch_1", "amount": 1250}, PermitID: approval,
//	}, func(ctx context.Context, a client.Attempt) (client.Result, error) {
//		r, err := refunds.Create(ctx, charge, amount, a.IdempotencyKey)
//		if err != nil {
//			return client.Result{}, err // classified: see ClassOf
//		}
//		return client.Result{ResourceID: r.ID}, nil
//	})
//
// The typed wrappers (Reserve, Complete, Fail, MarkUnknown, Lookup,
// Reconcile, Renew, ListUnresolved) expose every RPC; their errors are
// *Error values that match the sentinels with errors.Is. docs/client.md has
// the decision flow and the retry rules.
package client

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/jsonvalue"
)

// Client talks to one ledger. It is safe for concurrent use.
type Client struct {
	rpc  ledgerv1.LedgerServiceClient
	conn *grpc.ClientConn // when Dial made it

	mu          sync.RWMutex
	tools       map[string]ToolPolicy
	reconcilers map[string]Reconciler

	defaultTool   ToolPolicy
	backoff       Backoff
	ledgerRetries int
	callTimeout   time.Duration
	reportTimeout time.Duration
	dialOptions   []grpc.DialOption
	transport     credentials.TransportCredentials
	key           apiKey
}

// Option configures a Client.
type Option func(*Client)

// WithToolPolicy sets the policy of one tool (see SetToolPolicy).
func WithToolPolicy(tool string, p ToolPolicy) Option {
	return func(c *Client) { c.tools[tool] = p }
}

// WithDefaultToolPolicy sets the policy of tools without one
// (DefaultToolPolicy otherwise).
func WithDefaultToolPolicy(p ToolPolicy) Option { return func(c *Client) { c.defaultTool = p } }

// WithReconciler registers the reconciler of a tool (see
// RegisterReconciler).
func WithReconciler(tool string, r Reconciler) Option {
	return func(c *Client) { c.reconcilers[tool] = r }
}

// WithBackoff sets the delay between retries (DefaultBackoff otherwise).
func WithBackoff(b Backoff) Option { return func(c *Client) { c.backoff = b } }

// WithLedgerRetries sets how many times a call to the ledger is repeated
// when the ledger is unavailable (3 otherwise). The SDK is the one retry
// owner: the gRPC channel does not retry on its own.
func WithLedgerRetries(n int) Option { return func(c *Client) { c.ledgerRetries = n } }

// WithCallTimeout bounds each call Do makes to the ledger (5s otherwise,
// and when d is not positive: no call could be made within it); the typed
// wrappers use the caller's context as it is.
func WithCallTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.callTimeout = d
		}
	}
}

// WithReportTimeout bounds how long Do keeps recording an attempt's outcome
// (Complete, MarkUnknown, Reconcile), repeating the call while the ledger
// gives no answer, even after the caller's context has ended (10s
// otherwise, and when d is not positive). An outcome not recorded within it is returned as an error
// matching ErrUnavailable (ErrCompletionNotRecorded after a success).
func WithReportTimeout(d time.Duration) Option { return func(c *Client) { c.reportTimeout = d } }

// WithDialOptions are passed to grpc.NewClient by Dial, after the
// transport credentials (plaintext, or WithTLS's).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *Client) { c.dialOptions = append(c.dialOptions, opts...) }
}

// WithTLS makes Dial connect with TLS (plaintext otherwise, which ledgerd
// only serves on loopback). Add a client certificate to cfg for mTLS.
func WithTLS(cfg *tls.Config) Option {
	return func(c *Client) { c.transport = credentials.NewTLS(cfg) }
}

// WithAPIKey sends key ("<id>.<secret>", from "ledgerd keygen") with every
// call as "authorization: Bearer <key>", on the connection Dial makes or the
// one given to New (several Clients may share one connection, each with its
// own key). Over a connection without TLS the key is only sent to a
// loopback address or a Unix socket ("unix:PATH", "unix-abstract:NAME"): the
// target must name one, and the connection must reach one, whatever the name
// resolved to or a dialer did; elsewhere the call fails instead of exposing
// the key.
func WithAPIKey(key string) Option {
	return func(c *Client) { c.key = apiKey(key) }
}

// ErrInsecureAPIKey: Dial was asked to send an API key without TLS to an
// address that is neither loopback nor a Unix socket.
var ErrInsecureAPIKey = errors.New("client: refusing to send an API key without TLS beyond this machine (loopback or a Unix socket); add WithTLS")

// loopbackTarget reports whether a dial target names this machine: a
// "host:port" (possibly with a "dns:///" or "passthrough:///" scheme) on
// loopback, or a Unix socket ("unix:PATH", "unix:///PATH",
// "unix-abstract:NAME"), which never leaves the host.
func loopbackTarget(target string) bool {
	if u, err := url.Parse(target); err == nil && (u.Scheme == "unix" || u.Scheme == "unix-abstract") {
		return true
	}
	if i := strings.Index(target, ":///"); i >= 0 {
		target = target[i+4:]
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		host = target
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

type apiKey string

// GetRequestMetadata attaches the key, refusing to send it in clear beyond
// this machine. gRPC names a Unix socket's authority "localhost".
func (k apiKey) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) != nil {
		host := ""
		if len(uri) > 0 {
			if u, err := url.Parse(uri[0]); err == nil {
				host = u.Hostname()
			}
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, errors.New("client: refusing to send the API key without TLS to " + host)
		}
		// The name is not where the connection goes: a hosts file or
		// resolver may map localhost elsewhere, a dialer (WithDialOptions)
		// may connect anywhere. The peer the call is sent to decides.
		if p, ok := peer.FromContext(ctx); ok && !localPeer(p.Addr) {
			return nil, errors.New("client: refusing to send the API key without TLS to " + peerName(p.Addr) + " (the connection to " + host + " does not stay on this machine)")
		}
	}
	return map[string]string{"authorization": "Bearer " + string(k)}, nil
}

// localPeer reports whether a connection's remote address is on this
// machine: a loopback IP address or a Unix socket. Any other address,
// including one that names no IP address at all, is not known to be.
func localPeer(a net.Addr) bool {
	if a == nil {
		return false
	}
	switch a.Network() {
	case "unix", "unixgram", "unixpacket":
		return true
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		host = a.String()
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// peerName is a remote address as a refusal names it.
func peerName(a net.Addr) string {
	if a == nil {
		return "an unknown peer"
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// RequireTransportSecurity is false so the key also works with a plaintext
// loopback ledgerd; GetRequestMetadata guards everything else.
func (apiKey) RequireTransportSecurity() bool { return false }

// keyedConn sends an API key with every call on a shared connection.
type keyedConn struct {
	cc  grpc.ClientConnInterface
	key apiKey
}

func (k keyedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return k.cc.Invoke(ctx, method, args, reply, append(opts, grpc.PerRPCCredentials(k.key))...)
}

func (k keyedConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return k.cc.NewStream(ctx, desc, method, append(opts, grpc.PerRPCCredentials(k.key))...)
}

// New returns a Client on an existing connection.
func New(cc grpc.ClientConnInterface, opts ...Option) *Client {
	c := newClient(opts)
	if cc != nil && c.key != "" {
		cc = keyedConn{cc: cc, key: c.key}
	}
	c.rpc = ledgerv1.NewLedgerServiceClient(checkedConn{cc})
	return c
}

func newClient(opts []Option) *Client {
	c := &Client{
		tools:         map[string]ToolPolicy{},
		reconcilers:   map[string]Reconciler{},
		defaultTool:   DefaultToolPolicy,
		backoff:       DefaultBackoff,
		ledgerRetries: 3,
		callTimeout:   5 * time.Second,
		reportTimeout: defaultReportTimeout,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Dial connects to the ledger at target (host:port); the connection is made
// on the first call. With WithAPIKey and without WithTLS it refuses a target
// that is neither loopback nor a Unix socket (ErrInsecureAPIKey).
func Dial(target string, opts ...Option) (*Client, error) {
	c := newClient(opts)
	transport := c.transport
	if transport == nil {
		if c.key != "" && !loopbackTarget(target) {
			return nil, ErrInsecureAPIKey
		}
		transport = insecure.NewCredentials()
	}
	dialOpts := append([]grpc.DialOption{grpc.WithTransportCredentials(transport)}, c.dialOptions...)
	if c.key != "" {
		dialOpts = append(dialOpts, grpc.WithPerRPCCredentials(c.key))
	}
	conn, err := grpc.NewClient(target, dialOpts...)
	if err != nil {
		return nil, err
	}
	c.conn, c.rpc = conn, ledgerv1.NewLedgerServiceClient(checkedConn{conn})
	return c, nil
}

// checkedConn answers a request gRPC cannot encode (a string that is not
// UTF-8: an id, a tool, a note) as the ledger answers one it cannot decode,
// INVALID_ARGUMENT: nothing was sent. gRPC says INTERNAL, which callers
// retry.
type checkedConn struct{ grpc.ClientConnInterface }

func (c checkedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	if status.Code(err) != codes.Internal {
		return err
	}
	// The same message comes from a server that could not encode its
	// answer, after the call took effect: only a request that does not
	// encode here was refused before it left.
	if m, ok := args.(proto.Message); ok {
		if _, merr := proto.Marshal(m); merr != nil {
			return notSent
		}
	}
	return err
}

// notSent is the refusal of a request that does not encode.
var notSent = func() error {
	st, err := status.New(codes.InvalidArgument, "invalid request: a string field is not valid UTF-8 (nothing was sent)").
		WithDetails(&errdetails.ErrorInfo{Reason: "INVALID_ARGUMENT", Domain: "ledger.v1"})
	if err != nil {
		panic(err)
	}
	return st.Err()
}()

// Conn returns the connection Dial made (nil for New).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection Dial made.
func (c *Client) Close() error {
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// SetToolPolicy sets the timeout, retries and effect Do uses for a tool,
// e.g. search_orders {3s, 2}, get_shipping_status {8s, 2}, create_refund
// {10s, 1}.
func (c *Client) SetToolPolicy(tool string, p ToolPolicy) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tools[tool] = p
}

// RegisterReconciler sets the reconciler Do runs when the ledger answers
// RECONCILE for the tool.
func (c *Client) RegisterReconciler(tool string, r Reconciler) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reconcilers[tool] = r
}

func (c *Client) toolPolicy(tool string) ToolPolicy {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if p, ok := c.tools[tool]; ok {
		return p
	}
	return c.defaultTool
}

func (c *Client) reconciler(tool string) Reconciler {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.reconcilers[tool]
}

// NewHolder returns a fresh holder id: 128 random bits. Generate one per
// call of an operation and reuse it only to retry that same call, so a lost
// Reserve response can be recovered; never share one between concurrent
// callers (a hostname or a process id would be shared). Do does this.
func NewHolder() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("client: no randomness for a holder id: " + err.Error())
	}
	return "h-" + hex.EncodeToString(b[:])
}

// Reserve records the intent of op under holder and returns the decision.
// May return an error matching ErrKeyReused, ErrKeyExpired,
// ErrInvalidArgument or ErrUnavailable.
func (c *Client) Reserve(ctx context.Context, op Op, holder string) (*Reservation, error) {
	req := &ledgerv1.ReserveRequest{
		OperationId: op.ID, Tool: op.Tool, Effect: op.Effect, PermitId: op.PermitID,
		Holder: holder, RunId: op.RunID, Step: op.Step,
	}
	if op.Params != nil {
		// Go values of types of their own are taken as their JSON encoding.
		// The wire carries numbers as doubles: refuse what would not survive
		// that (integers beyond 2^53, NaN) rather than fingerprint a rounded
		// value that another request would share.
		params, err := jsonvalue.Params(op.Params)
		if err != nil {
			return nil, &Error{Reason: "INVALID_ARGUMENT", Message: "params: " + err.Error(), sentinel: ErrInvalidArgument}
		}
		s, err := structpb.NewStruct(params)
		if err != nil {
			return nil, &Error{Reason: "INVALID_ARGUMENT", Message: "params: " + err.Error(), sentinel: ErrInvalidArgument}
		}
		req.Params = s
	}
	if !op.RetainUntil.IsZero() {
		req.RetainUntil = timestamppb.New(op.RetainUntil)
	}
	req.Compensates = op.Compensates
	r, err := c.rpc.Reserve(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	return &Reservation{
		Decision:   r.GetDecision(),
		Operation:  withReceipt(operationFromProto(r.GetOperation()), r.GetReceipt()),
		RetryAfter: r.GetRetryAfter().AsDuration(),
		Holder:     r.GetHolder(),
	}, nil
}

// Complete reports a successful attempt with its result.
func (c *Client) Complete(ctx context.Context, id string, token uint64, r Result) (*Operation, error) {
	res, err := resultToProto(r)
	if err != nil {
		return nil, &Error{Reason: "INVALID_ARGUMENT", Message: "result: " + err.Error(), sentinel: ErrInvalidArgument}
	}
	return c.complete(ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token, Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: res})
}

// Fail reports a failed attempt: final (the operation fails for good) or
// retryable (proven not applied: the operation returns to PENDING).
func (c *Client) Fail(ctx context.Context, id string, token uint64, final bool, f Failure) (*Operation, error) {
	out := ledgerv1.Outcome_OUTCOME_FAILED_RETRYABLE
	if final {
		out = ledgerv1.Outcome_OUTCOME_FAILED_FINAL
	}
	return c.complete(ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: token, Outcome: out,
		Failure: &ledgerv1.Failure{Code: f.Code, Message: f.Message, Detail: f.Detail}})
}

func (c *Client) complete(ctx context.Context, req *ledgerv1.CompleteRequest) (*Operation, error) {
	r, err := c.rpc.Complete(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	return withReceipt(operationFromProto(r.GetOperation()), r.GetReceipt()), nil
}

// MarkUnknown reports that the attempt cannot tell whether the effect
// happened; reason is a short note (never parameters or secrets).
func (c *Client) MarkUnknown(ctx context.Context, id string, token uint64, reason string) (*Operation, error) {
	r, err := c.rpc.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: token, Reason: reason})
	if err != nil {
		return nil, fromStatus(err)
	}
	return withReceipt(operationFromProto(r.GetOperation()), r.GetReceipt()), nil
}

// Caller is who a client's credentials are: GetCaller's answer.
type Caller struct {
	Tenant    string   // the tenant the credentials belong to
	Principal string   // recorded in the history: the API key's id, or "cert:<name>"
	Scopes    []string // agent, reconciler and/or viewer
}

// Caller asks the ledger who the client's credentials are. Every scope may
// ask; it reads nothing from the store.
func (c *Client) Caller(ctx context.Context) (*Caller, error) {
	r, err := c.rpc.GetCaller(ctx, &ledgerv1.GetCallerRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	return &Caller{Tenant: r.GetTenant(), Principal: r.GetPrincipal(), Scopes: r.GetScopes()}, nil
}

// Lookup reads an operation with its history.
func (c *Client) Lookup(ctx context.Context, id string) (*Operation, error) {
	r, err := c.rpc.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id})
	if err != nil {
		return nil, fromStatus(err)
	}
	return withReceipt(operationFromProto(r.GetOperation()), r.GetReceipt()), nil
}

// Reconcile records what the destination says about an operation (about
// the attempt with f.FencingToken, when set), and returns the record after
// it with its history (a ledger older than that returns it without). On a
// resolved operation the same finding, with the result (failure) recorded,
// succeeds again; any other is ErrAlreadyResolved and changes nothing.
func (c *Client) Reconcile(ctx context.Context, id string, f Finding) (*Operation, error) {
	req := &ledgerv1.ReconcileRequest{OperationId: id, Finding: f.Kind, Note: f.Note, FencingToken: f.FencingToken}
	if f.Kind == Applied {
		res, err := resultToProto(f.Result)
		if err != nil {
			return nil, &Error{Reason: "INVALID_ARGUMENT", Message: "result: " + err.Error(), sentinel: ErrInvalidArgument}
		}
		req.Result = res
	}
	if f.Failure != nil && f.Kind == Abandon {
		req.Failure = &ledgerv1.Failure{Code: f.Failure.Code, Message: f.Failure.Message, Detail: f.Failure.Detail}
	}
	r, err := c.rpc.Reconcile(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	return withReceipt(operationFromProto(r.GetOperation()), r.GetReceipt()), nil
}

// Renew extends the lease of the claim with token.
func (c *Client) Renew(ctx context.Context, id string, token uint64) (*Operation, error) {
	r, err := c.rpc.Renew(ctx, &ledgerv1.RenewRequest{OperationId: id, FencingToken: token})
	if err != nil {
		return nil, fromStatus(err)
	}
	return operationFromProto(r.GetOperation()), nil
}

// ListOptions select a page of unresolved operations. The filters (States,
// Tool, Overdue, NeedsReview) combine: an operation is listed when it
// matches every one set. A ledger older than Overdue and NeedsReview
// ignores them and lists the operations the others select: a caller that
// must see only those checks RecoveryDeadline and NeedsReview itself.
type ListOptions struct {
	PageSize  uint32 // 0: the ledger's default (100); at most 1000
	PageToken string // the previous page's NextPageToken; empty: the first
	States    []State
	Tool      string
	// Overdue: only UNKNOWN operations past their recovery deadline, by the
	// store's clock.
	Overdue bool
	// NeedsReview: only operations escalated to a human.
	NeedsReview bool
}

// Page is one page of unresolved operations, oldest first.
type Page struct {
	Operations    []*Operation
	NextPageToken string
}

// ListUnresolved returns a page of the tenant's unresolved operations. A
// page may hold fewer than PageSize operations (none, even) while
// NextPageToken is set: keep paging until it is empty.
func (c *Client) ListUnresolved(ctx context.Context, o ListOptions) (*Page, error) {
	r, err := c.rpc.ListUnresolved(ctx, &ledgerv1.ListUnresolvedRequest{PageSize: o.PageSize, PageToken: o.PageToken, States: o.States, Tool: o.Tool,
		Overdue: o.Overdue, NeedsReview: o.NeedsReview})
	if err != nil {
		return nil, fromStatus(err)
	}
	p := &Page{NextPageToken: r.GetNextPageToken()}
	for _, op := range r.GetOperations() {
		p.Operations = append(p.Operations, operationFromProto(op))
	}
	return p, nil
}

// withReceipt sets the receipt an answer carried on its operation.
func withReceipt(o *Operation, receipt string) *Operation {
	if o != nil {
		o.Receipt = receipt
	}
	return o
}
