package server

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/auth"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/ledger"
)

const (
	healthService   = "grpc.health.v1.Health"
	reflectionV1    = "grpc.reflection.v1.ServerReflection"
	reflectionAlpha = "grpc.reflection.v1alpha.ServerReflection"
)

var ledgerService = ledgerv1.LedgerService_ServiceDesc.ServiceName

type scopesKey struct{}

// authFunc authenticates a call and attaches its principal and scopes.
func (a *Authenticator) authFunc(ctx context.Context) (context.Context, error) {
	p, err := a.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	addLog(ctx, slog.String("ledger.tenant", p.Tenant), slog.String("ledger.principal", p.ID))
	ctx = WithPrincipal(ctx, p.Principal)
	return context.WithValue(ctx, scopesKey{}, p.scopes), nil
}

// authInterceptors authenticate every call but health checks (and
// reflection, when it is public), then check the scope of ledger calls.
func authInterceptors(a *Authenticator, publicReflection bool) (grpc.UnaryServerInterceptor, grpc.StreamServerInterceptor) {
	needsAuth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		switch c.Service {
		case healthService:
			return false
		case reflectionV1, reflectionAlpha:
			return !publicReflection
		}
		return true
	})
	unaryAuth := selector.UnaryServerInterceptor(auth.UnaryServerInterceptor(a.authFunc), needsAuth)
	streamAuth := selector.StreamServerInterceptor(auth.StreamServerInterceptor(a.authFunc), needsAuth)
	unary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return unaryAuth(ctx, req, info, func(ctx context.Context, req any) (any, error) {
			service, method := splitMethod(info.FullMethod)
			if service == ledgerService {
				scopes, _ := ctx.Value(scopesKey{}).([]Scope)
				if !allowed(scopes, method) {
					return nil, errPermissionDenied(method)
				}
			}
			return handler(ctx, req)
		})
	}
	return unary, streamAuth
}

func splitMethod(full string) (service, method string) {
	full = strings.TrimPrefix(full, "/")
	i := strings.LastIndexByte(full, '/')
	if i < 0 {
		return "", full
	}
	return full[:i], full[i+1:]
}

// tenantLimiter is a token bucket per tenant: rate calls per second, burst
// at once, unless the credentials file sets the tenant's own. Each limit the
// file leaves at zero is the service-wide one; a burst that is zero there
// too is the tenant's rate rounded up (burstOf).
type tenantLimiter struct {
	rate   float64
	burst  int
	limits func(tenant string) TenantLimits // overrides; nil for none

	mu      sync.Mutex
	tenants map[string]*rate.Limiter
}

func (t *tenantLimiter) limiter(tenant string) *rate.Limiter {
	r, b := t.rate, t.burst
	if t.limits != nil {
		o := t.limits(tenant)
		if o.Rate > 0 {
			r = o.Rate
		}
		if o.Burst > 0 {
			b = o.Burst
		}
	}
	if r <= 0 {
		return nil
	}
	if b <= 0 {
		b = burstOf(r)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.tenants[tenant]
	if !ok || l.Limit() != rate.Limit(r) || l.Burst() != b {
		// New, or the file was reloaded with other limits: a full bucket
		// at them. (Changing the old one's limits would credit the time
		// since its last call at the old rate.)
		l = rate.NewLimiter(rate.Limit(r), b)
		t.tenants[tenant] = l
	}
	return l
}

// maxBurst bounds the burst burstOf derives from a rate.
const maxBurst = 1 << 30

// burstOf is the burst of a bucket whose burst is not set: its rate of
// calls per second, rounded up (at least 1, at most maxBurst).
func burstOf(rate float64) int {
	if !(rate < maxBurst) {
		return maxBurst
	}
	return max(1, int(math.Ceil(rate)))
}

// interceptor refuses a tenant's call beyond its rate with
// RESOURCE_EXHAUSTED (RATE_LIMITED) and a RetryInfo saying when a token will
// be there. (go-grpc-middleware's ratelimit interceptor replaces the error
// with its own status, which would drop the ErrorInfo and RetryInfo the
// contract promises.)
func (t *tenantLimiter) interceptor(anon string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, call *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if service, _ := splitMethod(call.FullMethod); service != ledgerService {
			return handler(ctx, req)
		}
		tenant := anon
		if p, ok := ctx.Value(principalKey{}).(ledger.Principal); ok {
			tenant = p.Tenant
		}
		if l := t.limiter(tenant); l != nil {
			r := l.Reserve()
			if d := r.Delay(); !r.OK() || d > 0 {
				r.Cancel()
				if !r.OK() {
					d = time.Second
				}
				return nil, withDetails(codes.ResourceExhausted,
					"the tenant is over its rate of "+strconv.FormatFloat(float64(l.Limit()), 'g', -1, 64)+" calls per second; back off",
					info(ReasonRateLimited, nil), &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}).Err()
			}
		}
		return handler(ctx, req)
	}
}

// decodeErrors wraps the ledger service's handlers so a request the codec
// could not decode (see requestCodec) gets INVALID_ARGUMENT with the
// contract's details, not grpc-go's bare INTERNAL or RESOURCE_EXHAUSTED.
//
// The generated handler decodes the request before it runs the interceptor
// chain, and returns at once when decoding fails. So the wrapper lets it go
// on with the empty request and has the chain end in the decoding error
// instead of the method: the call is authenticated (an unauthenticated
// caller gets UNAUTHENTICATED, not a description of its request), counted
// against its tenant's rate, logged and measured like any other, and
// nothing reaches the ledger. (A message the transport itself refuses,
// more than four times the size limit, is answered by grpc-go with
// RESOURCE_EXHAUSTED before any of this: see New.) Being the outermost
// frame of each call, the wrapper also grows the call's stack once
// (growStack).
func decodeErrors(sd grpc.ServiceDesc) grpc.ServiceDesc {
	methods := make([]grpc.MethodDesc, len(sd.Methods))
	for i, m := range sd.Methods {
		h := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, in grpc.UnaryServerInterceptor) (any, error) {
			growStack() // while the stack is shallow: see stack.go
			// dec leaves a request the codec could not decode empty, with
			// a mark (markFailure); an error from dec is the transport's,
			// whose status grpc-go has sent already.
			chain := func(ctx context.Context, req any, call *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
				if m, ok := req.(proto.Message); ok {
					if desc := decodeFailure(m); desc != "" {
						handler = func(context.Context, any) (any, error) {
							return nil, undecodable(desc)
						}
					}
				}
				if in == nil {
					return handler(ctx, req)
				}
				return in(ctx, req, call, handler)
			}
			return h(srv, ctx, dec, chain)
		}
		methods[i] = m
	}
	sd.Methods = methods
	return sd
}

// undecodable is the answer to a request that could not be decoded, as desc
// describes.
func undecodable(desc string) error {
	return withDetails(codes.InvalidArgument, "invalid request: "+desc, info(ReasonInvalidArgument, nil),
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "request", Description: desc}}}).Err()
}
