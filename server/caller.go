package server

import (
	"context"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// GetCaller implements ledger.v1.LedgerService: the caller's tenant,
// principal and scopes (every scope when the service runs without
// credentials).
func (h *handler) GetCaller(ctx context.Context, _ *ledgerv1.GetCallerRequest) (*ledgerv1.GetCallerResponse, error) {
	p := h.principal(ctx)
	scopes, ok := ctx.Value(scopesKey{}).([]Scope)
	if !ok {
		scopes = []Scope{ScopeAgent, ScopeReconciler, ScopeViewer}
	}
	resp := &ledgerv1.GetCallerResponse{Tenant: p.Tenant, Principal: p.ID}
	for _, s := range scopes {
		resp.Scopes = append(resp.Scopes, string(s))
	}
	return resp, nil
}
