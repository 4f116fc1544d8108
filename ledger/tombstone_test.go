package ledger

import (
	"slices"
	"strings"
	"testing"
)

// TestTombstoneKeepsTheFingerprint (S4, S6): the tombstone of an expired
// operation keeps its fingerprint (contract.md §6), so a Reserve under the key with
// other parameters is IDEMPOTENCY_KEY_REUSED (differs "params"), not
// IDEMPOTENCY_KEY_EXPIRED with a final state that is not that request's,
// while a late replay of the same request is still EXPIRED. This holds
// while the expired record is whole and after compaction; parameters outside the consequential fields bound
// at creation do not count. Nothing is executed or written.
func TestTombstoneKeepsTheFingerprint(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		reserve := func(id, tool string, params map[string]any) (*ReserveResult, error) {
			return e.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: id, Tool: tool, Params: params, PermitID: "permit-1", Holder: "late-" + randomHex(4)})
		}
		same := map[string]any{"amount": 10.0}
		other := map[string]any{"amount": 11.0}
		for _, id := range []string{"ok", "fields"} {
			tool := "compact.refund"
			if id == "fields" {
				tool = "compact.fields"
			}
			o := e.execute(t, id, tool)
			if _, err := e.complete(t, id, o.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r-" + id}, nil); err != nil {
				t.Fatal(err)
			}
		}
		e.waitExpired(t, "ok", "fields")

		check := func(stage string) {
			t.Helper()
			for _, c := range []struct {
				id, tool string
				params   map[string]any
				reused   bool
			}{
				{"ok", "compact.refund", other, true},
				{"ok", "compact.refund", same, false},
				// Another tool or permit with the same parameters: the
				// tombstone cannot tell (it keeps the fingerprint only).
				{"ok", "compact.other", same, false},
				{"fields", "compact.fields", map[string]any{"amount": 10.0, "memo": "not consequential"}, false},
				{"fields", "compact.fields", map[string]any{"amount": 11.0, "memo": "not consequential"}, true},
			} {
				before, _ := e.stored(t, e.opKeys(c.id).all[0])
				res, err := reserve(c.id, c.tool, c.params)
				if c.reused {
					if ee := wantKind(t, err, KindKeyReused); !slices.Equal(ee.Differs, []string{"params"}) {
						t.Fatalf("%s: %s %v: differs %v, want [params]", stage, c.id, c.params, ee.Differs)
					}
				} else if ee := wantKind(t, err, KindKeyExpired); ee.State != StateSucceeded {
					t.Fatalf("%s: %s %v: expired in state %v", stage, c.id, c.params, ee.State)
				}
				if res != nil {
					t.Fatalf("%s: %s: a decision %v for an expired key", stage, c.id, res.Decision)
				}
				if after, _ := e.stored(t, e.opKeys(c.id).all[0]); after != before {
					t.Fatalf("%s: %s: the Reserve changed the stored record", stage, c.id)
				}
			}
		}
		check("expired")

		// The consequential fields bound at creation decide, also when the
		// policy lists others now (another ledger with such a policy).
		pol, err := ParsePolicies([]byte("tools:\n  - match: \"compact.fields\"\n    consequential_fields: [\"/amount\", \"/memo\"]\n"))
		if err != nil {
			t.Fatal(err)
		}
		changed, err := New(e.lrdb, Options{Policies: pol})
		if err != nil {
			t.Fatal(err)
		}
		_, err = changed.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "fields", Tool: "compact.fields", Params: map[string]any{"amount": 10.0, "memo": "other"}, PermitID: "permit-1", Holder: "late"})
		wantKind(t, err, KindKeyExpired)
		_, err = changed.Reserve(e.ctx, e.who, ReserveRequest{OperationID: "fields", Tool: "compact.fields", Params: map[string]any{"amount": 12.0, "memo": "other"}, PermitID: "permit-1", Holder: "late"})
		wantKind(t, err, KindKeyReused)

		if _, err := e.compactor(0).Pass(e.ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"ok", "fields"} {
			if s, _ := e.stored(t, e.opKeys(id).all[0]); s != tombstoneOf(s) {
				t.Fatalf("%s was not compacted", id)
			}
		}
		check("compacted")
	})
}

// TestCompactedTombstoneKeepsTheBoundFields: a compacted tombstone keeps the
// consequential fields its fingerprint was taken over, as the whole record
// does, so when the tool's consequential_fields change after compaction a
// late replay with the same parameters is still IDEMPOTENCY_KEY_EXPIRED and
// other parameters are IDEMPOTENCY_KEY_REUSED, whether the record bound a
// list of fields or every parameter. A tombstone compacted before it kept
// them answers as it did: the current policy's fields count, so after the
// change even the same parameters are IDEMPOTENCY_KEY_REUSED. Nothing is
// executed or written.
func TestCompactedTombstoneKeepsTheBoundFields(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		params := map[string]any{"amount": 10.0, "memo": "m"}
		tools := map[string]string{"fields": "compact.fields", "all": "compact.refund", "old": "compact.fields"}
		for _, id := range []string{"fields", "all", "old"} {
			res := e.reserve(t, id, tools[id], params, "h-"+id)
			if res.Decision != DecisionExecute {
				t.Fatalf("Reserve(%s) = %v, want EXECUTE", id, res.Decision)
			}
			if _, err := e.complete(t, id, res.Operation.FencingToken, OutcomeSucceeded, &Result{ResourceID: "r-" + id}, nil); err != nil {
				t.Fatal(err)
			}
		}
		e.waitExpired(t, "fields", "all", "old")
		if _, err := e.compactor(0).Pass(e.ctx); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"fields", "all", "old"} {
			if s, _ := e.stored(t, e.opKeys(id).all[0]); s != tombstoneOf(s) {
				t.Fatalf("%s was not compacted", id)
			}
		}
		// "old" as compacted before the tombstone kept its fields: the
		// fingerprint and the first four fields only.
		key := e.opKeys("old").all[0]
		s, ttl := e.stored(t, key)
		if err := e.rdb.Set(e.ctx, key, s[:33]+strings.Join(strings.SplitN(s[33:], "\xff", 5)[:4], "\xff"), ttl).Err(); err != nil {
			t.Fatal(err)
		}

		// Another ledger whose policy lists other fields now.
		pol, err := ParsePolicies([]byte("tools:\n  - match: \"compact.fields\"\n    consequential_fields: [\"/amount\", \"/memo\"]\n" +
			"  - match: \"compact.refund\"\n    consequential_fields: [\"/amount\"]\n"))
		if err != nil {
			t.Fatal(err)
		}
		changed, err := New(e.lrdb, Options{Policies: pol})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			id     string
			params map[string]any
			reused bool
			l      *Ledger // changed when nil
		}{
			// Bound ["/amount"]: memo did not count, amount does.
			{"fields", map[string]any{"amount": 10.0, "memo": "other"}, false, nil},
			{"fields", map[string]any{"amount": 12.0, "memo": "m"}, true, nil},
			// Bound every parameter: memo counts.
			{"all", params, false, nil},
			{"all", map[string]any{"amount": 10.0, "memo": "other"}, true, nil},
			// The earlier tombstone answers as before: compared over the
			// current fields, so even the same parameters differ (design.md).
			{"old", params, true, changed},
			{"old", params, false, e.l},
			{"old", map[string]any{"amount": 12.0, "memo": "m"}, true, e.l},
		} {
			if c.l == nil {
				c.l = changed
			}
			before, _ := e.stored(t, e.opKeys(c.id).all[0])
			res, err := c.l.Reserve(e.ctx, e.who, ReserveRequest{OperationID: c.id, Tool: tools[c.id], Params: c.params, PermitID: "permit-1", Holder: "late"})
			if c.reused {
				if ee := wantKind(t, err, KindKeyReused); !slices.Equal(ee.Differs, []string{"params"}) {
					t.Fatalf("%s %v: differs %v, want [params]", c.id, c.params, ee.Differs)
				}
			} else if ee := wantKind(t, err, KindKeyExpired); ee.State != StateSucceeded {
				t.Fatalf("%s %v: expired in state %v", c.id, c.params, ee.State)
			}
			if res != nil {
				t.Fatalf("%s: a decision %v for an expired key", c.id, res.Decision)
			}
			if after, _ := e.stored(t, e.opKeys(c.id).all[0]); after != before {
				t.Fatalf("%s: the Reserve changed the stored tombstone", c.id)
			}
			if _, err := c.l.Lookup(e.ctx, e.who, c.id); KindOf(err) != KindKeyExpired {
				t.Fatalf("Lookup(%s) of the tombstone: %v, want expired", c.id, err)
			}
		}
	})
}
