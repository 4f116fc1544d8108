package server_test

import (
	"encoding/hex"
	"testing"

	"google.golang.org/grpc/codes"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestConsequentialFieldsOverTheWire: contract.md §6: with a policy naming the
// consequential fields (picky.*), only they are fingerprinted: a retry that
// changes another parameter replays, one that changes a named field is
// IDEMPOTENCY_KEY_REUSED. The fingerprints are those of the worked example
// of docs/configuration.md, section 6.5, with the fields and without, and a
// precomputed params_sha256 of the selection is the same request.
func TestConsequentialFieldsOverTheWire(t *testing.T) {
	const (
		withFields    = "9525913bec02bb3e488cc124c29b093efae216d35853c767da99e6fdc8db3aa0"
		withoutFields = "b993b65b9ecc00edc4f7789a0a317ccfd0bc5d5143e6ae570a3736d56ba32ea2"
	)
	params := map[string]any{"currency": "EUR", "amount": 12.5, "charge_id": "ch_1", "memo": "thanks"}
	eachBackend(t, func(t *testing.T, e *env) {
		for _, tc := range []struct{ tool, want string }{{"picky.refund", withFields}, {"payments.refund", withoutFields}} {
			id := e.id(tc.tool + "-example")
			res, err := e.c.Reserve(e.ctx, reserveReq(id, tc.tool, mustStruct(t, params), newHolder()))
			if err != nil || res.Decision != execute {
				t.Fatalf("Reserve(%s) = %v, %v", tc.tool, res, err)
			}
			if got := hex.EncodeToString(res.Operation.ParamsSha256); got != tc.want {
				t.Errorf("%s: params_sha256 %s, want %s", tc.tool, got, tc.want)
			}
			e.complete(t, id, res.Operation.FencingToken, outSucceeded, "R-1")
		}

		id := e.id("picky.refund-example")
		before := e.lookup(t, id)
		retry := func(p map[string]any) (*ledgerv1.ReserveResponse, error) {
			return e.c.Reserve(e.ctx, reserveReq(id, "picky.refund", mustStruct(t, p), newHolder()))
		}
		// Another memo, and a parameter more: not consequential.
		res, err := retry(map[string]any{"currency": "EUR", "amount": 12.5, "charge_id": "ch_1", "memo": "many thanks", "locale": "de"})
		if err != nil || res.Decision != replay || res.Operation.Result.GetResourceId() != "R-1" {
			t.Fatalf("retry with another memo = %v, %v; want REPLAY", res, err)
		}
		// The precomputed fingerprint of the selection.
		sum, _ := hex.DecodeString(withFields)
		req := reserveReq(id, "picky.refund", nil, newHolder())
		req.ParamsSha256 = sum
		if res, err := e.c.Reserve(e.ctx, req); err != nil || res.Decision != replay {
			t.Fatalf("retry with params_sha256 = %v, %v; want REPLAY", res, err)
		}
		// A named field changed, or left out.
		for _, p := range []map[string]any{
			{"currency": "EUR", "amount": 125, "charge_id": "ch_1", "memo": "thanks"},
			{"currency": "EUR", "amount": 12.5, "memo": "thanks"},
		} {
			_, err := retry(p)
			if ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED"); ei.Metadata["differs"] != "params" {
				t.Fatalf("differs = %q", ei.Metadata["differs"])
			}
		}
		e.wantUnchanged(t, id, before)

		// Without named fields, the memo counts.
		_, err = e.c.Reserve(e.ctx, reserveReq(e.id("payments.refund-example"), "payments.refund",
			mustStruct(t, map[string]any{"currency": "EUR", "amount": 12.5, "charge_id": "ch_1", "memo": "many thanks"}), newHolder()))
		wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
	})
}
