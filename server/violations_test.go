package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// TestFieldViolationsNameTheWireField: a bad field of any RPC is refused
// with INVALID_ARGUMENT and a BadRequest whose field violation names the
// request field as the proto spells it (a path into nested messages), so a
// client in any language can point at it. The record is left as it was.
func TestFieldViolationsNameTheWireField(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		id := e.id("op")
		res, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", mustStruct(t, map[string]any{"amount": 1}), newHolder()))
		if err != nil {
			t.Fatal(err)
		}
		tok := res.Operation.FencingToken
		before := e.lookup(t, id)
		long := strings.Repeat("n", 300)
		succeeded := ledgerv1.Outcome_OUTCOME_SUCCEEDED

		cases := []struct {
			name  string
			call  func() error
			field string
		}{
			{"Reserve permit_id", func() error {
				r := reserveReq(id, "payments.refund", nil, newHolder())
				r.PermitId = strings.Repeat("p", 300)
				_, err := e.c.Reserve(e.ctx, r)
				return err
			}, "permit_id"},
			{"Reserve holder", func() error {
				_, err := e.c.Reserve(e.ctx, reserveReq(id, "payments.refund", nil, "a\nb"))
				return err
			}, "holder"},
			{"Reserve run_id", func() error {
				r := reserveReq(id, "payments.refund", nil, newHolder())
				r.RunId = strings.Repeat("r", 300)
				_, err := e.c.Reserve(e.ctx, r)
				return err
			}, "run_id"},
			{"Complete fencing_token", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, Outcome: succeeded})
				return err
			}, "fencing_token"},
			{"Complete outcome", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok})
				return err
			}, "outcome"},
			{"Complete result.resource_id", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: succeeded,
					Result: &ledgerv1.Result{ResourceId: strings.Repeat("x", 300)}})
				return err
			}, "result.resource_id"},
			{"Complete result.data", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: succeeded,
					Result: &ledgerv1.Result{Data: mustStruct(t, map[string]any{"blob": strings.Repeat("x", 70<<10)})}})
				return err
			}, "result.data"},
			{"Complete failure.message", func() error {
				_, err := e.c.Complete(e.ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: tok, Outcome: ledgerv1.Outcome_OUTCOME_FAILED_FINAL,
					Failure: &ledgerv1.Failure{Message: strings.Repeat("m", 2000)}})
				return err
			}, "failure.message"},
			{"MarkUnknown reason", func() error {
				_, err := e.c.MarkUnknown(e.ctx, &ledgerv1.MarkUnknownRequest{OperationId: id, FencingToken: tok, Reason: long})
				return err
			}, "reason"},
			{"Renew operation_id", func() error {
				_, err := e.c.Renew(e.ctx, &ledgerv1.RenewRequest{FencingToken: tok})
				return err
			}, "operation_id"},
			{"Lookup operation_id", func() error {
				_, err := e.c.Lookup(e.ctx, &ledgerv1.LookupRequest{OperationId: "a\x00b"})
				return err
			}, "operation_id"},
			{"Reconcile finding", func() error {
				_, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id})
				return err
			}, "finding"},
			{"Reconcile note", func() error {
				_, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ESCALATE, Note: long})
				return err
			}, "note"},
			{"Reconcile failure.code", func() error {
				_, err := e.c.Reconcile(e.ctx, &ledgerv1.ReconcileRequest{OperationId: id, Finding: ledgerv1.Finding_FINDING_ABANDON,
					Failure: &ledgerv1.Failure{Code: strings.Repeat("c", 200)}})
				return err
			}, "failure.code"},
			{"ListUnresolved states", func() error {
				_, err := e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{States: []ledgerv1.State{ledgerv1.State_STATE_SUCCEEDED}})
				return err
			}, "states"},
			{"ListUnresolved page_token", func() error {
				_, err := e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{PageToken: "not a token"})
				return err
			}, "page_token"},
			{"ListUnresolved tool", func() error {
				_, err := e.c.ListUnresolved(e.ctx, &ledgerv1.ListUnresolvedRequest{Tool: "no spaces"})
				return err
			}, "tool"},
		}
		for _, c := range cases {
			err := c.call()
			if err == nil {
				t.Fatalf("%s: accepted", c.name)
			}
			code, ei, br := errorInfo(t, err)
			if code != codes.InvalidArgument || ei.Reason != "INVALID_ARGUMENT" || br == nil || len(br.FieldViolations) == 0 {
				t.Fatalf("%s: %v, want INVALID_ARGUMENT with a BadRequest", c.name, err)
			}
			var fields []string
			for _, v := range br.FieldViolations {
				fields = append(fields, v.Field)
			}
			if len(fields) != 1 || fields[0] != c.field {
				t.Errorf("%s: violations on %q, want only %q", c.name, fields, c.field)
			}
		}
		if after := e.lookup(t, id); !proto.Equal(before, after) {
			t.Fatalf("a refused request changed the record:\n%v\n%v", before, after)
		}
	})
}
