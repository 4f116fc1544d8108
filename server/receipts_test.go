package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/opledger/ledger/fingerprint"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/internal/redistest"
	"github.com/opledger/ledger/internal/servicetest"
	"github.com/opledger/ledger/receipt"
)

// TestReceipts: each terminal or UNKNOWN answer carries a receipt that
// verifies with the issuer's key set and signs what the record holds (the
// result's digest, never the result); a refusal of a changed request
// carries one of the refusal; a running operation has none, nor does a
// ledger without receipt keys.
func TestReceipts(t *testing.T) {
	key, err := receipt.NewKey("k-test")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := receipt.NewSigner("ledgerd-test", []*receipt.Key{key})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Shared(t).Client(t)
	st := servicetest.Start(t, rdb, servicetest.Options{Policy: ledgertest.Policy, Receipts: signer})
	conn, err := grpc.NewClient(st.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c, ctx := ledgerv1.NewLedgerServiceClient(conn), context.Background()
	id := "receipts-" + randomHex(4)
	verify := func(what, jws string) *receipt.Claims {
		t.Helper()
		claims, err := receipt.Verify(jws, signer.JWKS())
		if err != nil {
			t.Fatalf("%s: %v (%q)", what, err, jws)
		}
		return claims
	}

	params := mustStruct(t, map[string]any{"amount": 25, "card": "4111-SECRET"})
	res, err := c.Reserve(ctx, reserveReq(id+":refund", "payments.refund", params, newHolder()))
	if err != nil || res.Receipt != "" {
		t.Fatalf("EXECUTE: %v, receipt %q (a running operation has none)", err, res.GetReceipt())
	}
	data := mustStruct(t, map[string]any{"refund": "re_1", "amount": 25})
	done, err := c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: id + ":refund", FencingToken: res.Operation.FencingToken,
		Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "re_1", Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	got := verify("Complete", done.Receipt)
	looked, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id + ":refund"})
	if err != nil || looked.Operation.HistoryHead == "" {
		t.Fatalf("Lookup: %v %v", looked, err)
	}
	canon, _ := fingerprint.Canonical(map[string]any{"data": map[string]any{"refund": "re_1", "amount": 25.0}, "resource_id": "re_1"})
	sum := sha256.Sum256(canon)
	want := receipt.Claims{Version: receipt.Version, Issuer: "ledgerd-test", IssuedAt: got.IssuedAt, Tenant: "default",
		OperationID: id + ":refund", Tool: "payments.refund", ParamsSHA256: hex.EncodeToString(done.Operation.ParamsSha256), PermitID: "permit-1",
		State: "STATE_SUCCEEDED", Attempt: 1, FencingToken: strconv.FormatUint(res.Operation.FencingToken, 10),
		ResultSHA256: hex.EncodeToString(sum[:]), ResourceID: "re_1", HistoryHead: looked.Operation.HistoryHead}
	if *got != want {
		t.Fatalf("Complete's receipt signs\n%+v\nwant\n%+v", *got, want)
	}
	replay, err := c.Reserve(ctx, reserveReq(id+":refund", "payments.refund", params, newHolder()))
	if err != nil || replay.Decision != ledgerv1.Decision_DECISION_REPLAY {
		t.Fatalf("REPLAY: %v %v", replay, err)
	}
	if r := verify("REPLAY", replay.Receipt); r.State != "STATE_SUCCEEDED" || r.ResultSHA256 != want.ResultSHA256 {
		t.Fatalf("REPLAY's receipt: %+v", r)
	}
	look, err := c.Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id + ":refund"})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if r := verify("Lookup", look.Receipt); r.ResourceID != "re_1" || r.HistoryHead != look.Operation.HistoryHead || r.HistoryHead != want.HistoryHead {
		t.Fatalf("Lookup's receipt: %+v, the answer's head %q", r, look.Operation.HistoryHead)
	}

	_, err = c.Reserve(ctx, reserveReq(id+":refund", "payments.refund", mustStruct(t, map[string]any{"amount": 26}), newHolder()))
	ei := wantReason(t, err, codes.FailedPrecondition, "IDEMPOTENCY_KEY_REUSED")
	if r := verify("the refusal", ei.Metadata["receipt"]); r.Refused != "IDEMPOTENCY_KEY_REUSED" || r.Differs != "params" ||
		r.ParamsSHA256 == want.ParamsSHA256 || r.OperationID != id+":refund" {
		t.Fatalf("the refusal's receipt: %+v", r)
	}

	other, err := c.Reserve(ctx, reserveReq(id+":ticket", "payments.ticket", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	unknown, err := c.MarkUnknown(ctx, &ledgerv1.MarkUnknownRequest{OperationId: id + ":ticket", FencingToken: other.Operation.FencingToken})
	if err != nil || verify("MarkUnknown", unknown.Receipt).State != "STATE_UNKNOWN" {
		t.Fatalf("MarkUnknown: %v", err)
	}
	abandoned, err := c.Reconcile(ctx, &ledgerv1.ReconcileRequest{OperationId: id + ":ticket", Finding: ledgerv1.Finding_FINDING_ABANDON,
		Failure: &ledgerv1.Failure{Code: "gave_up"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := verify("Reconcile", abandoned.Receipt); r.State != "STATE_FAILED_FINAL" || r.FailureCode != "gave_up" || r.ResultSHA256 != "" ||
		r.FailureDetailSHA256 != "" {
		t.Fatalf("Reconcile's receipt: %+v", r)
	}

	// A failure's detail is signed by its digest, on the answer and on the replay.
	charge, err := c.Reserve(ctx, reserveReq(id+":charge", "payments.refund", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	detail := "card 4111-SECRET declined"
	failed, err := c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: id + ":charge", FencingToken: charge.Operation.FencingToken,
		Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL, Failure: &ledgerv1.Failure{Code: "tool_error", Detail: detail}})
	if err != nil {
		t.Fatal(err)
	}
	detailSum := sha256.Sum256([]byte(detail))
	again, err := c.Reserve(ctx, reserveReq(id+":charge", "payments.refund", params, newHolder()))
	if err != nil || again.Decision != ledgerv1.Decision_DECISION_REPLAY || again.Operation.GetFailure().GetDetail() != detail {
		t.Fatalf("the failure's replay: %v %v", again, err)
	}
	for what, jws := range map[string]string{"Complete": failed.Receipt, "REPLAY": again.Receipt} {
		if r := verify(what, jws); r.FailureCode != "tool_error" || r.FailureDetailSHA256 != hex.EncodeToString(detailSum[:]) {
			t.Fatalf("%s's receipt of a failure with a detail: %+v", what, r)
		}
	}

	// Data nested as deep as a Complete may send is signed by its digest too.
	deep := map[string]any{}
	for i, inner := 1, deep; i < fingerprint.MaxDepth; i++ {
		inner["a"] = map[string]any{}
		inner = inner["a"].(map[string]any)
	}
	claim, err := c.Reserve(ctx, reserveReq(id+":deep", "payments.refund", params, newHolder()))
	if err != nil {
		t.Fatal(err)
	}
	deepDone, err := c.Complete(ctx, &ledgerv1.CompleteRequest{OperationId: id + ":deep", FencingToken: claim.Operation.FencingToken,
		Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: &ledgerv1.Result{ResourceId: "re_deep", Data: mustStruct(t, deep)}})
	if err != nil {
		t.Fatalf("Complete with data %d levels deep: %v", fingerprint.MaxDepth, err)
	}
	if r := verify("Complete of deep data", deepDone.Receipt); r.ResourceID != "re_deep" || r.ResultSHA256 == "" {
		t.Fatalf("the receipt of deep data: %+v", r)
	}

	// Without keys, no receipts.
	off := servicetest.Start(t, rdb, servicetest.Options{Policy: ledgertest.Policy})
	oc, err := grpc.NewClient(off.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = oc.Close() })
	if l, err := ledgerv1.NewLedgerServiceClient(oc).Lookup(ctx, &ledgerv1.LookupRequest{OperationId: id + ":refund"}); err != nil || l.Receipt != "" {
		t.Fatalf("receipts off: %v, %q", err, l.GetReceipt())
	}
}
