// Package server is the gRPC edge of the operation ledger: it serves
// ledger.v1.LedgerService (plus grpc.health.v1 and server reflection) on top
// of package ledger, which holds the state machine.
//
// The edge converts protos to the ledger's types and back, maps the ledger's
// errors to the statuses of the contract (each with a google.rpc.ErrorInfo of
// domain "ledger.v1"; BadRequest field violations for INVALID_ARGUMENT;
// RetryInfo where a retry is due), and runs one interceptor chain: structured
// logging (slog, one line per call with ids, decision, state and a
// fingerprint prefix; never parameters, results or secrets) and panic
// recovery (Internal, with the stack in the log).
//
// The tenant of every call comes from the caller's credentials, never from a
// request field: an API key ("authorization: Bearer <id>.<secret>", compared
// in constant time against its SHA-256 in the credentials file) or a verified
// client certificate the file maps. Scopes decide which methods a credential
// may call (agent, reconciler, viewer; PERMISSION_DENIED otherwise), and a
// token bucket per tenant bounds its rate (RESOURCE_EXHAUSTED with
// RetryInfo). Without credentials configured every caller is the default
// tenant, which ledgerd only allows on loopback.
package server

import (
	"context"
	"encoding/hex"
	"log/slog"
	"net"
	"runtime/debug"
	"time"
	"unicode/utf8"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
	"github.com/opledger/ledger/receipt"
)

// DefaultTenant is the tenant of every caller while no authentication is
// configured.
const DefaultTenant = "default"

// DefaultMaxRequestBytes bounds the size of one request message.
const DefaultMaxRequestBytes = 1 << 20

// StreamWorkers is how many long-lived goroutines run the calls: a call
// that finds them all busy gets a goroutine of its own, as every call would
// without them (docs/benchmarks.md, 6.11).
const StreamWorkers = 64

// Config configures the gRPC service.
type Config struct {
	// Ledger serves the calls. Required.
	Ledger *ledger.Ledger
	// Logger receives one line per call (slog.Default when nil).
	Logger *slog.Logger
	// DefaultTenant is the tenant of callers no interceptor identified
	// (DefaultTenant when empty).
	DefaultTenant string
	// MaxRequestBytes bounds one request message (DefaultMaxRequestBytes
	// when zero).
	MaxRequestBytes int
	// Auth authenticates every call but health checks, and checks its
	// scope. Nil serves every caller as DefaultTenant: ledgerd then listens
	// on loopback only.
	Auth *Authenticator
	// PublicReflection serves reflection to unauthenticated callers when
	// Auth is set (it describes the API, not any data).
	PublicReflection bool
	// Rate and Burst bound each tenant's calls per second and at once
	// (Rate 0: no limit; Burst 0: the rate, rounded up); the credentials
	// file may set a tenant's own (TenantLimits).
	Rate  float64
	Burst int
	// Connections bounds the client connections: how many at once, and
	// each one's handshake time, idle time, age, keepalive and calls at
	// once, and the health watches they hold together (zero fields:
	// their defaults).
	Connections ConnectionLimits
	// Receipts signs a receipt of every terminal or UNKNOWN answer and of
	// every IDEMPOTENCY_KEY_REUSED refusal (nil: receipts are off).
	Receipts *receipt.Signer
}

// Service is the gRPC server with the ledger, health and reflection
// services registered.
type Service struct {
	// GRPC is the server; register more services on it before Serve.
	GRPC *grpc.Server
	// Health reports SERVING for "" and "ledger.v1.LedgerService" until
	// Shutdown.
	Health *health.Server

	conns   *connCounter
	watches *watchGate
	// authRefusals spaces the call log lines of calls refused for their
	// credentials (writeCallLog).
	authRefusals *logEvery
}

// handler implements ledger.v1.LedgerService.
type handler struct {
	ledgerv1.UnimplementedLedgerServiceServer
	l        *ledger.Ledger
	log      *slog.Logger
	anon     ledger.Principal
	receipts *receipt.Signer
}

var _ ledgerv1.LedgerServiceServer = (*handler)(nil)

// New builds the service. Extra options (credentials, more interceptors)
// come after its codec, size limit and connection limits, so they may
// replace them; the
// interceptors among them run before the service's own chain (outermost
// first), so that they see every call, also one refused by authentication,
// its scope or its tenant's rate, or one that panicked: the RPC metrics
// (metrics.Metrics.ServerOptions) count every call so.
func New(cfg Config, opts ...grpc.ServerOption) *Service {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	tenant := cfg.DefaultTenant
	if tenant == "" {
		tenant = DefaultTenant
	}
	maxBytes := cfg.MaxRequestBytes
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRequestBytes
	}
	recoverOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return withDetails(codes.Internal, "internal error", info(ReasonInternal, nil)).Err()
	})}
	// The service's chain, outermost first (inside the interceptors of
	// opts): the bound on health watches (whose refusals are logged on
	// their own), one log line per call, panic recovery, authentication
	// and scope, the tenant's rate.
	watches := cfg.Connections.watchGate(log)
	authRefusals := &logEvery{every: refusalLogEvery, now: time.Now}
	logUnary, logStream := callLoggers(log, authRefusals)
	unary := []grpc.UnaryServerInterceptor{logUnary, recovery.UnaryServerInterceptor(recoverOpts...)}
	stream := []grpc.StreamServerInterceptor{watches.interceptor, logStream, recovery.StreamServerInterceptor(recoverOpts...)}
	if cfg.Auth != nil {
		u, st := authInterceptors(cfg.Auth, cfg.PublicReflection)
		unary, stream = append(unary, u), append(stream, st)
	}
	limits := &tenantLimiter{rate: cfg.Rate, burst: cfg.Burst, tenants: map[string]*rate.Limiter{}}
	if cfg.Auth != nil {
		limits.limits = func(t string) TenantLimits { return cfg.Auth.Credentials().Limits(t) }
	}
	unary = append(unary, limits.interceptor(tenant))
	all := append([]grpc.ServerOption{
		// The codec refuses requests over maxBytes with INVALID_ARGUMENT;
		// the transport drops what is far over it before reading it whole.
		grpc.ForceServerCodecV2(newRequestCodec(maxBytes)),
		grpc.MaxRecvMsgSize(max(4*maxBytes, maxBytes+64<<10)),
		grpc.NumStreamWorkers(StreamWorkers),
	}, cfg.Connections.serverOptions()...)
	all = append(all, opts...)
	// grpc-go chains interceptors in the order of the options: the
	// caller's first.
	all = append(all, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	s := grpc.NewServer(all...)
	desc := decodeErrors(ledgerv1.LedgerService_ServiceDesc)
	s.RegisterService(&desc, &handler{l: cfg.Ledger, log: log, anon: ledger.Principal{Tenant: tenant, ID: "anonymous"}, receipts: cfg.Receipts})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(ledgerv1.LedgerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	reflection.Register(s)
	return &Service{GRPC: s, Health: hs, conns: cfg.Connections.counter(log), watches: watches, authRefusals: authRefusals}
}

// Serve accepts calls on lis until Shutdown. The connections it accepts
// count towards Config.Connections.MaxConnections, with those of every other
// listener the service serves.
func (s *Service) Serve(lis net.Listener) error {
	return s.GRPC.Serve(s.CountConnections(lis))
}

// CountConnections returns lis, whose connections count towards
// Config.Connections.MaxConnections as those Serve accepts do: one over
// the limit is closed as soon as it is accepted.
func (s *Service) CountConnections(lis net.Listener) net.Listener {
	return &countingListener{Listener: lis, c: s.conns}
}

// Connections returns the counts of the client connections: open now, and
// refused for being over the limit.
func (s *Service) Connections() ConnectionStats { return s.conns.stats() }

// HealthWatches returns the counts of the health Watch streams: open now,
// and refused for being over the limit.
func (s *Service) HealthWatches() HealthWatchStats { return s.watches.stats() }

// Shutdown reports NOT_SERVING to health checks, lets running calls finish
// until ctx ends, then cancels those still running. It returns once every
// handler has returned (the wait of GracefulStop, which Stop ends early
// but does not skip), so what the handlers use, such as the Redis client,
// can be closed after it.
func (s *Service) Shutdown(ctx context.Context) {
	s.Health.Shutdown()
	done := make(chan struct{})
	go func() { s.GRPC.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.GRPC.Stop()
		<-done
	}
}

// errorReason is an error's ErrorInfo reason, for its log line ("" when
// it has none).
func errorReason(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetReason()
		}
	}
	return ""
}

type principalKey struct{}

// WithPrincipal returns a context in which the caller is p. Authenticating
// interceptors call it; handlers take the tenant from it.
func WithPrincipal(ctx context.Context, p ledger.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

func (h *handler) principal(ctx context.Context) ledger.Principal {
	if p, ok := ctx.Value(principalKey{}).(ledger.Principal); ok {
		return p
	}
	return h.anon
}

// fail converts err to the contract's status; an internal error's cause is
// logged (it names no parameters) and not sent. So is the store's own reason
// for refusing a call (OOM, READONLY, LOADING, a refused dial, too few
// replicas), as ledger.store_error on the call's line: the caller only
// learns STORE_UNAVAILABLE, the operator needs to know what to fix.
func (h *handler) fail(ctx context.Context, err error) error {
	st := toStatus(err)
	switch {
	case st.Code() == codes.Internal:
		h.log.ErrorContext(ctx, "internal error", "error", err.Error())
	case ledger.KindOf(err) == ledger.KindUnavailable, ledger.KindOf(err) == ledger.KindNotReplicated:
		addLog(ctx, slog.String("ledger.store_error", err.Error()))
	}
	return st.Err()
}

// logOp adds the operation's state, attempt and fingerprint prefix, and the
// string pairs in more, to the call's log line and trace span.
func logOp(ctx context.Context, o *ledger.Operation, more ...string) {
	if o == nil {
		annotate(ctx, nil, more)
		return
	}
	var buf [5]slog.Attr
	attrs := append(buf[:0], slog.String("ledger.state", o.State.String()), slog.Int64("ledger.attempt", int64(o.Attempt)),
		slog.Any("ledger.fingerprint", fingerprintPrefix{&o.Fingerprint}))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("ledger.state", o.State.String()), attribute.Int("ledger.attempt", int(o.Attempt)))
	}
	annotate(ctx, attrs, more)
}

// logID adds the operation id, and the string pairs in more, to the call's
// log line and trace span. They are logged before the ledger validates the
// request: the id is cut to its size limit (bounded), and so must be the
// values in more.
func logID(ctx context.Context, id string, more ...string) {
	id = bounded(id, ledger.MaxOperationIDLen)
	var buf [3]slog.Attr
	annotate(ctx, append(buf[:0], slog.String("ledger.operation_id", id)), more)
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetAttributes(attribute.String("ledger.operation_id", id))
	}
}

// truncated marks a value bounded cut.
const truncated = "...(truncated)"

// bounded is s, or, when s is longer than max bytes (and so invalid, the
// request refused), its first max bytes at most, cut at a character
// boundary, followed by truncated: a request may not write more than a
// field's size limit into the log.
func bounded(s string, max int) string {
	if len(s) <= max {
		return s
	}
	i := max
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + truncated
}

// annotate adds attrs and the string pairs in more to the call's log line,
// and the pairs in more to its trace span when the span records.
func annotate(ctx context.Context, attrs []slog.Attr, more []string) {
	for i := 0; i+1 < len(more); i += 2 {
		attrs = append(attrs, slog.String(more[i], more[i+1]))
	}
	if len(attrs) == 0 {
		return
	}
	addLog(ctx, attrs...)
	if span := trace.SpanFromContext(ctx); len(more) > 0 && span.IsRecording() {
		for i := 0; i+1 < len(more); i += 2 {
			span.SetAttributes(attribute.String(more[i], more[i+1]))
		}
	}
}

// fingerprintPrefix logs the first 16 hex digits of a fingerprint; they are
// formatted only when the line is written (slog resolves a LogValuer then),
// not on every call. It holds a pointer so that it fits in an interface
// without an allocation.
type fingerprintPrefix struct{ f *fingerprint.Fingerprint }

// LogValue implements slog.LogValuer.
func (p fingerprintPrefix) LogValue() slog.Value {
	return slog.StringValue(hex.EncodeToString(p.f[:8]))
}

// Reserve implements ledger.v1.LedgerService.
func (h *handler) Reserve(ctx context.Context, req *ledgerv1.ReserveRequest) (*ledgerv1.ReserveResponse, error) {
	logID(ctx, req.GetOperationId(), "ledger.tool", bounded(req.GetTool(), ledger.MaxToolLen), "ledger.run_id", bounded(req.GetRunId(), ledger.MaxRunIDLen))
	var errs requestErrors
	params, bad := reserveParams(req, &errs)
	if bad != "" {
		return nil, undecodable(bad)
	}
	var retain time.Time
	if req.GetRetainUntil() != nil {
		if err := req.GetRetainUntil().CheckValid(); err != nil {
			errs.add("retain_until", "not a valid timestamp")
		} else {
			retain = req.GetRetainUntil().AsTime()
		}
	}
	if err := errs.err(); err != nil {
		return nil, h.fail(ctx, err)
	}
	var sha []byte
	if len(req.GetParamsSha256()) > 0 {
		sha = req.GetParamsSha256()
	}
	res, err := h.l.Reserve(ctx, h.principal(ctx), ledger.ReserveRequest{
		OperationID:  req.GetOperationId(),
		Tool:         req.GetTool(),
		Params:       params,
		ParamsSHA256: sha,
		Effect:       ledger.Effect(enum8(req.GetEffect())),
		PermitID:     req.GetPermitId(),
		Holder:       req.GetHolder(),
		RunID:        req.GetRunId(),
		Step:         req.GetStep(),
		RetainUntil:  retain,
		Compensates:  req.GetCompensates(),
	})
	if err != nil {
		h.refusalReceipt(ctx, req, err)
		return nil, h.fail(ctx, err)
	}
	logOp(ctx, res.Operation, "ledger.decision", res.Decision.String())
	out := &ledgerv1.ReserveResponse{
		Decision:  ledgerv1.Decision(res.Decision),
		Operation: toProto(res.Operation),
		Holder:    res.Holder,
	}
	if res.Decision == ledger.DecisionInProgress {
		out.RetryAfter = durationpb.New(res.RetryAfter)
	}
	if res.Decision == ledger.DecisionReplay || res.Decision == ledger.DecisionReconcile {
		out.Receipt = h.receiptOf(ctx, res.Operation, out.Operation)
	}
	return out, nil
}

// Complete implements ledger.v1.LedgerService.
func (h *handler) Complete(ctx context.Context, req *ledgerv1.CompleteRequest) (*ledgerv1.CompleteResponse, error) {
	logID(ctx, req.GetOperationId(), "ledger.outcome", req.GetOutcome().String())
	var errs requestErrors
	result, bad := fromResult("result", req.GetResult(), "ledger.v1.CompleteRequest", &errs)
	if bad != "" {
		return nil, undecodable(bad)
	}
	if err := errs.err(); err != nil {
		return nil, h.fail(ctx, err)
	}
	o, err := h.l.Complete(ctx, h.principal(ctx), ledger.CompleteRequest{
		OperationID:  req.GetOperationId(),
		FencingToken: req.GetFencingToken(),
		Outcome:      ledger.Outcome(enum8(req.GetOutcome())),
		Result:       result,
		Failure:      fromFailure(req.GetFailure()),
	})
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	logOp(ctx, o)
	p := toProto(o)
	return &ledgerv1.CompleteResponse{Operation: p, Receipt: h.receiptOf(ctx, o, p)}, nil
}

// MarkUnknown implements ledger.v1.LedgerService.
func (h *handler) MarkUnknown(ctx context.Context, req *ledgerv1.MarkUnknownRequest) (*ledgerv1.MarkUnknownResponse, error) {
	logID(ctx, req.GetOperationId())
	o, err := h.l.MarkUnknown(ctx, h.principal(ctx), ledger.MarkUnknownRequest{
		OperationID:  req.GetOperationId(),
		FencingToken: req.GetFencingToken(),
		Reason:       req.GetReason(),
	})
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	logOp(ctx, o)
	p := toProto(o)
	return &ledgerv1.MarkUnknownResponse{Operation: p, Receipt: h.receiptOf(ctx, o, p)}, nil
}

// Lookup implements ledger.v1.LedgerService.
func (h *handler) Lookup(ctx context.Context, req *ledgerv1.LookupRequest) (*ledgerv1.LookupResponse, error) {
	logID(ctx, req.GetOperationId())
	o, err := h.l.Lookup(ctx, h.principal(ctx), req.GetOperationId())
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	logOp(ctx, o)
	p := toProto(o)
	return &ledgerv1.LookupResponse{Operation: p, Receipt: h.receiptOf(ctx, o, p)}, nil
}

// Reconcile implements ledger.v1.LedgerService.
func (h *handler) Reconcile(ctx context.Context, req *ledgerv1.ReconcileRequest) (*ledgerv1.ReconcileResponse, error) {
	logID(ctx, req.GetOperationId(), "ledger.finding", req.GetFinding().String())
	var errs requestErrors
	// The codec decodes a Reconcile whole: nothing is kept to be bad.
	result, _ := fromResult("result", req.GetResult(), "ledger.v1.ReconcileRequest", &errs)
	if err := errs.err(); err != nil {
		return nil, h.fail(ctx, err)
	}
	o, err := h.l.Reconcile(ctx, h.principal(ctx), ledger.ReconcileRequest{
		OperationID:  req.GetOperationId(),
		Finding:      ledger.Finding(enum8(req.GetFinding())),
		Result:       result,
		Failure:      fromFailure(req.GetFailure()),
		Note:         req.GetNote(),
		FencingToken: req.GetFencingToken(),
	})
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	logOp(ctx, o)
	p := toProto(o)
	return &ledgerv1.ReconcileResponse{Operation: p, Receipt: h.receiptOf(ctx, o, p)}, nil
}

// Renew implements ledger.v1.LedgerService.
func (h *handler) Renew(ctx context.Context, req *ledgerv1.RenewRequest) (*ledgerv1.RenewResponse, error) {
	logID(ctx, req.GetOperationId())
	o, err := h.l.Renew(ctx, h.principal(ctx), ledger.RenewRequest{
		OperationID:  req.GetOperationId(),
		FencingToken: req.GetFencingToken(),
	})
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	logOp(ctx, o)
	return &ledgerv1.RenewResponse{Operation: toProto(o)}, nil
}

// ListUnresolved implements ledger.v1.LedgerService.
func (h *handler) ListUnresolved(ctx context.Context, req *ledgerv1.ListUnresolvedRequest) (*ledgerv1.ListUnresolvedResponse, error) {
	size := req.GetPageSize()
	if size > ledger.MaxPageSize {
		size = ledger.MaxPageSize + 1 // refused by the ledger, without overflow
	}
	lr := ledger.ListRequest{PageSize: int(size), PageToken: req.GetPageToken(), Tool: req.GetTool(),
		Overdue: req.GetOverdue(), NeedsReview: req.GetNeedsReview()}
	for _, s := range req.GetStates() {
		lr.States = append(lr.States, ledger.State(enum8(s)))
	}
	page, err := h.l.ListUnresolved(ctx, h.principal(ctx), lr)
	if err != nil {
		return nil, h.fail(ctx, err)
	}
	out := &ledgerv1.ListUnresolvedResponse{NextPageToken: page.NextPageToken}
	for _, o := range page.Operations {
		out.Operations = append(out.Operations, toProto(o))
	}
	addLog(ctx, slog.Int("ledger.count", len(out.Operations)))
	return out, nil
}

// enum8 narrows a wire enum to the ledger's uint8 enums; numbers out of range
// become 255, which no ledger enum accepts, instead of wrapping around.
func enum8[E ~int32](v E) uint8 {
	if v < 0 || v > 254 {
		return 255
	}
	return uint8(v)
}
