package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"testing"
	"time"

	_ "embed"

	"github.com/redis/go-redis/v9"

	"github.com/opledger/ledger/fingerprint"
)

// The scripts of the previous record layout (a hash per record, a history
// list and a tombstone key), as they were released: records they wrote must
// keep working, and convert to the current layout on their next write.
var (
	//go:embed testdata/layout0/common.lua
	layout0Common string
	//go:embed testdata/layout0/reserve.lua
	layout0ReserveLua string
	//go:embed testdata/layout0/complete.lua
	layout0CompleteLua string

	layout0Reserve  = redis.NewScript(layout0Common + "\n" + layout0ReserveLua)
	layout0Complete = redis.NewScript(layout0Common + "\n" + layout0CompleteLua)
)

// layout0Digest is the previous layout's outcome digest: 32 hex digits.
func layout0Digest(o Outcome, r Result, f Failure) string {
	h := sha256.New()
	var n [8]byte
	h.Write([]byte{byte(o)})
	for _, part := range [][]byte{r.Data, []byte(r.ResourceID), []byte(f.Code), []byte(f.Message)} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

var layout0Params = map[string]any{"amount": 10.0}

// layout0Reserve reserves id with the previous layout's script (as the
// previous release did, with its lease in ms) and returns its token.
func (e *env) layout0Reserve(t *testing.T, id string, leaseMS int64) uint64 {
	t.Helper()
	k := e.opKeys(id)
	fp, _ := fingerprint.Compute(layout0Params, nil)
	p := DefaultPolicy
	res, err := layout0Reserve.Run(e.ctx, e.rdb, k.all, e.who.ID, k.member, "payments.refund", fp.String(), "permit-1", "h-old",
		int(EffectIrreversible), "", 0, 0, 0, leaseMS, 3, p.Retention.Milliseconds(), p.TombstoneRetention.Milliseconds(),
		p.RecoveryWindow.Milliseconds(), id, "", "", 0).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := res[0].(int64); code != codeExecute {
		t.Fatalf("layout-0 Reserve(%s) = %v", id, res)
	}
	flat, _ := res[2].([]any)
	for i := 0; i+1 < len(flat); i += 2 {
		if flat[i] == "tok" {
			return parseUint(flat[i+1].(string))
		}
	}
	t.Fatal("no token")
	return 0
}

func (e *env) layout0Complete(t *testing.T, id string, tok uint64, o Outcome, r Result, f Failure) {
	t.Helper()
	k := e.opKeys(id)
	res, err := layout0Complete.Run(e.ctx, e.rdb, k.all, e.who.ID, k.member, tok, int(o), layout0Digest(o, r, f),
		string(r.Data), r.ResourceID, f.Code, f.Message).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := res[0].(int64); code != codeOK {
		t.Fatalf("layout-0 Complete(%s) = %v", id, res)
	}
}

// TestPreviousLayoutRecords checks that records the previous release wrote
// (hash, history list, tombstone) are read, listed, replayed and resolved,
// keep their history, and convert to one string on their next write.
func TestPreviousLayoutRecords(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// A running claim: read, then completed (which converts it).
		tok := e.layout0Reserve(t, "running", 30000)
		got := e.lookup(t, "running")
		if got.State != StateRunning || got.Attempt != 1 || got.FencingToken != tok || !slices.Equal(reasons(got), []string{"RESERVED"}) ||
			got.History[0].Principal != "agent-1" || got.LeaseExpiresAt.IsZero() {
			t.Fatalf("layout-0 record read as %+v", got)
		}
		r := Result{Data: []byte(`{"id":"r-1"}`), ResourceID: "r-1"}
		if _, err := e.complete(t, "running", tok, OutcomeSucceeded, &r, nil); err != nil {
			t.Fatal(err)
		}
		k := e.opKeys("running")
		if typ, _ := e.rdb.Type(e.ctx, k.all[0]).Result(); typ != "string" {
			t.Fatalf("converted record is a %s", typ)
		}
		if n, _ := e.rdb.Exists(e.ctx, k.all[1], k.all[2]).Result(); n != 0 {
			t.Fatalf("%d keys of the previous layout left after the conversion", n)
		}
		got = e.lookup(t, "running")
		if got.State != StateSucceeded || got.Attempt != 1 || string(got.Result.Data) != `{"id":"r-1"}` ||
			!slices.Equal(reasons(got), []string{"RESERVED", "SUCCEEDED"}) || got.History[0].FencingToken != tok {
			t.Fatalf("converted record = %+v", got)
		}
		// The live counts the previous layout kept are moved, not leaked.
		counts, err := e.l.LiveCounts(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range counts {
			if c.Tenant == e.who.Tenant {
				t.Fatalf("live count %+v left after the terminal transition", c)
			}
		}

		// A terminal record is replayed; a repeat of its Complete agrees
		// with the digest the previous layout stored, another one conflicts.
		tok = e.layout0Reserve(t, "done", 30000)
		e.layout0Complete(t, "done", tok, OutcomeSucceeded, r, Failure{})
		res := e.reserve(t, "done", "payments.refund", layout0Params, "h-new")
		if res.Decision != DecisionReplay || string(res.Operation.Result.Data) != `{"id":"r-1"}` {
			t.Fatalf("replay of a layout-0 record = %v %+v", res.Decision, res.Operation)
		}
		if _, err := e.complete(t, "done", tok, OutcomeSucceeded, &r, nil); err != nil {
			t.Fatalf("repeat of a layout-0 Complete: %v", err)
		}
		_, err = e.complete(t, "done", tok, OutcomeSucceeded, &Result{ResourceID: "other"}, nil)
		wantKind(t, err, KindCompletionConflict)

		// Only a tombstone left: expired, never executed again.
		fp, _ := fingerprint.Compute(layout0Params, nil)
		if err := e.rdb.Set(e.ctx, e.opKeys("gone").all[2], "3:"+fp.String(), time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		_, err = e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "gone", Tool: "payments.refund", Params: layout0Params, PermitID: "permit-1", Holder: "h"})
		if ee := wantKind(t, err, KindKeyExpired); ee.State != StateSucceeded {
			t.Fatalf("expired state %v", ee.State)
		}

		// A claim past its lease is listed (read from its hash).
		unswept(func() {
			e.layout0Reserve(t, "stuck", 100)
			waitLeaseExpiry()
			page, err := e.l.ListUnresolved(e.ctx, e.who, ListRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Operations) != 1 || page.Operations[0].ID != "stuck" || page.Operations[0].State != StateRunning {
				var got []string
				for _, o := range page.Operations {
					got = append(got, o.ID+" "+o.State.String())
				}
				t.Fatalf("listed %v, want [stuck RUNNING]", got)
			}
		})
		// And the sweeper converts it on its way to UNKNOWN.
		e.sweep(t)
		if got := e.lookup(t, "stuck"); got.State != StateUnknown || !slices.Equal(reasons(got), []string{"RESERVED", "LEASE_EXPIRED"}) {
			t.Fatalf("swept layout-0 record = %+v", got)
		}
	})
}
