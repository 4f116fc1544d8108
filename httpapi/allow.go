package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// routes tells which methods a path of the API takes, and what a request
// of each reads: the google.api.http options of ledger.v1, matched by a
// grpc-gateway router of their own whose handlers only note which route
// was reached.
type routes struct {
	mux     *runtime.ServeMux
	methods []string // every method some path takes, sorted
}

// route is one binding of an RPC: its request message, and whether the
// request is read from the body (else from the path and the query).
type route struct {
	request protoreflect.MessageDescriptor
	body    bool
}

// reachedKey holds, in a probe's context, the route a handler sets.
type reachedKey struct{}

// newRoutes returns the routes of every binding of every RPC of ledger.v1.
func newRoutes() (*routes, error) {
	rt := &routes{mux: runtime.NewServeMux(runtime.WithRoutingErrorHandler(unrouted), runtime.WithErrorHandler(unmatched))}
	for _, b := range httpRules(ledgerv1.File_ledger_v1_ledger_proto.Services()) {
		method, path := ruleRoute(b.rule)
		found := route{request: b.rpc.Input(), body: b.rule.GetBody() != ""}
		reached := func(_ http.ResponseWriter, r *http.Request, _ map[string]string) {
			*r.Context().Value(reachedKey{}).(*route) = found
		}
		if err := rt.mux.HandlePath(method, path, reached); err != nil {
			return nil, fmt.Errorf("route %s %s: %w", method, path, err)
		}
		if !slices.Contains(rt.methods, method) {
			rt.methods = append(rt.methods, method)
		}
	}
	slices.Sort(rt.methods)
	return rt, nil
}

// unrouted and unmatched write nothing: a probe that reaches no route.
func unrouted(context.Context, *runtime.ServeMux, runtime.Marshaler, http.ResponseWriter, *http.Request, int) {
}
func unmatched(context.Context, *runtime.ServeMux, runtime.Marshaler, http.ResponseWriter, *http.Request, error) {
}

// binding is a google.api.http rule of an RPC.
type binding struct {
	rpc  protoreflect.MethodDescriptor
	rule *annotations.HttpRule
}

// httpRules returns the google.api.http rules of the services' methods,
// their additional bindings among them.
func httpRules(services protoreflect.ServiceDescriptors) []binding {
	var rules []binding
	for i := range services.Len() {
		methods := services.Get(i).Methods()
		for j := range methods.Len() {
			rpc := methods.Get(j)
			rule, _ := proto.GetExtension(rpc.Options(), annotations.E_Http).(*annotations.HttpRule)
			if rule == nil {
				continue
			}
			rules = append(rules, binding{rpc, rule})
			for _, more := range rule.GetAdditionalBindings() {
				rules = append(rules, binding{rpc, more})
			}
		}
	}
	return rules
}

// ruleRoute returns a rule's HTTP method and path template.
func ruleRoute(rule *annotations.HttpRule) (method, path string) {
	switch p := rule.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		return http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		return http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		return http.MethodPut, p.Put
	case *annotations.HttpRule_Delete:
		return http.MethodDelete, p.Delete
	case *annotations.HttpRule_Patch:
		return http.MethodPatch, p.Patch
	case *annotations.HttpRule_Custom:
		return p.Custom.GetKind(), p.Custom.GetPath()
	}
	return "", ""
}

// allow returns the Allow header of r's path: the methods it takes, HEAD
// with GET, comma-separated; "" for a path the API does not have.
func (rt *routes) allow(r *http.Request) string {
	var allowed []string
	for _, m := range rt.methods {
		reached := rt.find(r, m).request != nil
		if reached {
			allowed = append(allowed, m)
		}
		if reached && m == http.MethodGet {
			allowed = append(allowed, http.MethodHead)
		}
	}
	slices.Sort(allowed)
	return strings.Join(allowed, ", ")
}

// find returns the route that r's path reaches with method; its request
// is nil when there is none.
func (rt *routes) find(r *http.Request, method string) route {
	var found route
	probe := &http.Request{Method: method, URL: r.URL, Header: http.Header{}, Body: http.NoBody}
	rt.mux.ServeHTTP(discard{}, probe.WithContext(context.WithValue(r.Context(), reachedKey{}, &found)))
	return found
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// headAsGet serves a HEAD request as the GET of its path; net/http sends
// the answer's status and headers without its body.
func headAsGet(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead {
			r = r.Clone(r.Context())
			r.Method = http.MethodGet
		}
		next.ServeHTTP(w, r)
	})
}
