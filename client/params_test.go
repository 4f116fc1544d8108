package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/redistest"
)

// Params built in Go with types of their own ([]string, map[string]string,
// []int, int32, time.Time, structs) are taken as their JSON encoding: the
// operation is fingerprinted as the same params decoded from JSON (what a
// Python or Node caller sends), so that form replays the recorded result
// instead of being refused as another request under the same key, and the
// effect is applied once. An integer a double cannot carry is still
// refused, before anything runs.
func TestDoTakesTypedParamsAsTheirJSONEncoding(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	type line struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	typed := map[string]any{
		"ids": []string{"a", "b"}, "labels": map[string]string{"k": "v"}, "counts": []int{1, 2},
		"amount": int32(1250), "at": at, "line": line{"x-1", 3},
	}
	var asJSON map[string]any
	if err := json.Unmarshal([]byte(`{"ids":["a","b"],"labels":{"k":"v"},"counts":[1,2],
		"amount":1250,"at":"2026-12-01T09:30:00Z","line":{"sku":"x-1","qty":3}}`), &asJSON); err != nil {
		t.Fatal(err)
	}
	op := e.op("typed", "payments.refund", typed)
	res, err := e.c.Do(e.ctx, op, d.fn)
	if err != nil || res.Replayed || res.ResourceID != "R-1" {
		t.Fatalf("Do with typed params = %+v, %v; want R-1 run", res, err)
	}
	o, err := e.c.Lookup(e.ctx, op.ID)
	if err != nil {
		t.Fatal(err)
	}
	want, err := fingerprint.Compute(asJSON, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(o.ParamsSHA256) != string(want[:]) {
		t.Fatalf("params_sha256 = %x, want the JSON form's %x", o.ParamsSHA256, want[:])
	}
	op.Params = asJSON
	res, err = e.c.Do(e.ctx, op, d.fn)
	if err != nil || !res.Replayed || res.ResourceID != "R-1" {
		t.Fatalf("Do with the JSON form = %+v, %v; want R-1 replayed", res, err)
	}
	if n := d.totalApplied(); n != 1 || d.calls.Load() != 1 {
		t.Fatalf("applied %d times (fn called %d times), want once", n, d.calls.Load())
	}
	// Reserve takes them the same way.
	r, err := e.c.Reserve(e.ctx, e.op("typed", "payments.refund", typed), client.NewHolder())
	if err != nil || r.Decision != client.DecisionReplay {
		t.Fatalf("Reserve with typed params = %+v, %v; want a replay", r, err)
	}
	big := e.op("big", "payments.refund", map[string]any{"amounts": []int64{1<<53 + 1}})
	if _, err := e.c.Do(e.ctx, big, d.fn); !errors.Is(err, client.ErrInvalidArgument) || d.calls.Load() != 1 {
		t.Fatalf("Do with an integer beyond 2^53 = %v (fn called %d times), want ErrInvalidArgument", err, d.calls.Load())
	}
}

// A string that is not valid UTF-8 has no JSON form: inside a Go type of
// its own it is refused as it is in a map[string]any, instead of being
// sent with its bytes replaced by U+FFFD, which would make "caf\xe9" and
// "caf\xe8" one request: the second would replay the first's result.
func TestDoRefusesTypedParamsThatAreNotUTF8(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	for _, params := range []map[string]any{
		{"names": []string{"caf\xe9"}},
		{"names": []string{"caf\xe8"}},
		{"names": map[string]string{"caf\xe9": "x"}},
		{"name": "caf\xe9"},
	} {
		op := e.op("latin1", "payments.refund", params)
		if res, err := e.c.Do(e.ctx, op, d.fn); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("Do with %q = %+v, %v; want ErrInvalidArgument", params, res, err)
		}
	}
	if n := d.totalApplied(); n != 0 || d.calls.Load() != 0 {
		t.Fatalf("applied %d times (fn called %d times), want never", n, d.calls.Load())
	}
}

// Large doubles inside Go types of their own ([]float64{1e20}) are taken as
// the doubles they are, as float64 values in a map[string]any are, instead
// of being refused as integers beyond 2^53 because their JSON encoding has
// no decimal point; the JSON form replays them. An integer the wire would
// round is still refused.
func TestDoTakesLargeDoublesInTypedParams(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	d := newDestination()
	typed := map[string]any{"limits": []float64{1e20, 1 << 60, -1e18}, "cap": map[string]float64{"max": 1e20}}
	var asJSON map[string]any
	if err := json.Unmarshal([]byte(`{"limits":[1e20,1152921504606846976,-1e18],"cap":{"max":100000000000000000000}}`), &asJSON); err != nil {
		t.Fatal(err)
	}
	op := e.op("doubles", "payments.refund", typed)
	if res, err := e.c.Do(e.ctx, op, d.fn); err != nil || res.Replayed {
		t.Fatalf("Do with typed params = %+v, %v; want it run", res, err)
	}
	op.Params = asJSON
	if res, err := e.c.Do(e.ctx, op, d.fn); err != nil || !res.Replayed || res.ResourceID != "R-1" {
		t.Fatalf("Do with the JSON form = %+v, %v; want R-1 replayed", res, err)
	}
	if n := d.totalApplied(); n != 1 || d.calls.Load() != 1 {
		t.Fatalf("applied %d times (fn called %d times), want once", n, d.calls.Load())
	}
	for _, params := range []map[string]any{
		{"n": []int64{1<<53 + 1}},
		{"n": []uint64{1<<64 - 1}},
		{"n": []int64{-(1<<62 + 1)}},
		{"n": int64(1152921504606847000)},      // written as the digits of the double 2^60
		{"n": []int64{1152921504606847000}},    // the same, in a Go type of its own
		{"n": json.Number("9007199254740993")}, // JSON decoded with UseNumber
	} {
		if _, err := e.c.Do(e.ctx, e.op("rounded", "payments.refund", params), d.fn); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("Do with %v = %v, want ErrInvalidArgument", params, err)
		}
	}
	if d.calls.Load() != 1 {
		t.Fatalf("fn called %d times, want once", d.calls.Load())
	}
}

// Result data that the wire cannot carry as it is (an integer the wire's
// doubles would round, a string that is not valid UTF-8) is not recorded
// changed: the replay would return another resource than the one fn made
// (9007199254740993 recorded as 9007199254740992, a name with U+FFFD in
// place of its bytes). The effect is left to reconciliation at once
// instead, as for result data the ledger refuses (over its size limit), and
// fn is not run again.
func TestDoDoesNotRecordResultDataChanged(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	for name, data := range map[string]map[string]any{
		"big-int":       {"ids": []int64{1<<53 + 1}},
		"big-int64":     {"id": int64(1<<53 + 1)},
		"rounded-int64": {"id": int64(1152921504606847000)}, // its digits are the double 2^60's
		"invalid-utf8":  {"names": []string{"caf\xe9"}},
		// Over the ledger's size limit for result data: the ledger refuses
		// the Complete (INVALID_ARGUMENT), and the claim would otherwise
		// stay RUNNING until its lease ends.
		"too-large": {"blob": strings.Repeat("x", 70<<10)},
	} {
		t.Run(name, func(t *testing.T) {
			calls := 0
			op := e.op(name, "payments.refund", map[string]any{"n": 1})
			res, err := e.c.Do(e.ctx, op, func(context.Context, client.Attempt) (client.Result, error) {
				calls++
				return client.Result{ResourceID: "R-1", Data: data}, nil
			})
			if !errors.Is(err, client.ErrCompletionNotRecorded) || res.ResourceID != "R-1" {
				t.Fatalf("Do = %+v, %v; want fn's result with ErrCompletionNotRecorded", res, err)
			}
			o, err := e.c.Lookup(e.ctx, op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if o.State != client.StateUnknown || o.Result != nil {
				t.Fatalf("record %v with result %+v; want UNKNOWN, nothing recorded", o.State, o.Result)
			}
			if _, err := e.c.Do(e.ctx, op, func(context.Context, client.Attempt) (client.Result, error) {
				calls++
				return client.Result{}, nil
			}); !errors.Is(err, client.ErrNeedsReconciliation) || calls != 1 {
				t.Fatalf("Do again = %v, fn called %d times; want ErrNeedsReconciliation, fn once", err, calls)
			}
		})
	}
}

// A final failure whose code the ledger refuses (over its 128 bytes, or
// with a control character) is still recorded as the final failure it is,
// under the default code tool_failed: the claim is not left RUNNING until
// its lease ends, to become UNKNOWN and call for the reconciliation of an
// effect the tool said never happened.
func TestDoRecordsAFinalFailureWhoseCodeTheLedgerRefuses(t *testing.T) {
	e := newEnv(t, redistest.Shared(t).Client(t))
	for name, code := range map[string]string{"long": strings.Repeat("x", 200), "control": "declined\n", "not-utf8": "declin\xe9"} {
		t.Run(name, func(t *testing.T) {
			calls := 0
			op := e.op(name, "payments.refund", map[string]any{"n": 1})
			op.Effect = client.EffectIrreversible
			fn := func(context.Context, client.Attempt) (client.Result, error) {
				calls++
				return client.Result{}, client.MarkFinal(code, errors.New("card declined"))
			}
			var fe *client.FailedError
			if _, err := e.c.Do(e.ctx, op, fn); !errors.As(err, &fe) || fe.Code != "tool_failed" {
				t.Fatalf("Do = %v; want a *FailedError with the code recorded, tool_failed", err)
			}
			o, err := e.c.Lookup(e.ctx, op.ID)
			if err != nil {
				t.Fatal(err)
			}
			if o.State != client.StateFailedFinal || o.Failure == nil || o.Failure.Code != "tool_failed" {
				t.Fatalf("record %v with failure %+v; want FAILED_FINAL, tool_failed", o.State, o.Failure)
			}
			if _, err := e.c.Do(e.ctx, op, fn); !errors.As(err, &fe) || !fe.Replayed || calls != 1 {
				t.Fatalf("Do again = %v, fn called %d times; want the failure replayed, fn once", err, calls)
			}
		})
	}
}
