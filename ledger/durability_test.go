package ledger

import (
	"context"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/redistest"
)

// TestDurabilityUnreadableSaysWhy: a setting the check cannot read names
// +config|get as the remedy only when CONFIG GET was what the user was
// refused; when Redis is gone, granting it would change nothing.
func TestDurabilityUnreadableSaysWhy(t *testing.T) {
	srv := redistest.Start(t)
	srv.CreateUser(t, "noconfig", "noconfig-password", ACLRules(DefaultPrefix))
	l, err := New(srv.UserClient(t, "noconfig", "noconfig-password"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range l.CheckDurability(ctx) {
		if c.OK || !strings.Contains(c.Why, "NOPERM") || !strings.Contains(c.Why, "grant +config|get") {
			t.Fatalf("%s as a user without +config|get: ok %v, %q; want not ok, NOPERM and the grant", c.Name, c.OK, c.Why)
		}
	}
	srv.Stop()
	for _, c := range l.CheckDurability(ctx) {
		if c.OK || !strings.Contains(c.Why, "cannot be read") || strings.Contains(c.Why, "config|get") {
			t.Fatalf("%s with Redis gone: ok %v, %q; want not ok, unreadable, and no grant to suggest", c.Name, c.OK, c.Why)
		}
	}
}
