package ledger

import (
	"context"
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// Every state change is one of these scripts: atomic on the store, no
// read-modify-write from Go. Each file documents its KEYS, ARGV and returns;
// common.lua (prepended to each) documents the conventions they share.
var (
	//go:embed scripts/common.lua
	commonLua string
	//go:embed scripts/reserve.lua
	reserveLua string
	//go:embed scripts/complete.lua
	completeLua string
	//go:embed scripts/mark_unknown.lua
	markUnknownLua string
	//go:embed scripts/renew.lua
	renewLua string
	//go:embed scripts/reconcile.lua
	reconcileLua string
	//go:embed scripts/expire.lua
	expireLua string
	//go:embed scripts/lookup.lua
	lookupLua string
	//go:embed scripts/compact.lua
	compactLua string
	//go:embed scripts/runs.lua
	runsLua string
	//go:embed scripts/run_start.lua
	runStartLua string
	//go:embed scripts/run_admit.lua
	runAdmitLua string
	//go:embed scripts/run_get.lua
	runGetLua string
	//go:embed scripts/run_end.lua
	runEndLua string
	//go:embed scripts/run_settle.lua
	runSettleLua string
	//go:embed scripts/compensate.lua
	compensateLua string

	reserveScript     = newScript(reserveLua)
	completeScript    = newScript(completeLua)
	markUnknownScript = newScript(markUnknownLua)
	renewScript       = newScript(renewLua)
	reconcileScript   = newScript(reconcileLua)
	expireScript      = newScript(expireLua)
	lookupScript      = newScript(lookupLua)
	compactScript     = newScript(compactLua)
	compensateScript  = newScript(compensateLua)
	runStartScript    = newRunScript(runStartLua)
	runAdmitScript    = newRunScript(runAdmitLua)
	runGetScript      = newRunScript(runGetLua)
	runEndScript      = newRunScript(runEndLua)
	runSettleScript   = newRunScript(runSettleLua)
)

var allScripts = []*redis.Script{
	reserveScript, completeScript, markUnknownScript, renewScript,
	reconcileScript, expireScript, lookupScript, compactScript, compensateScript,
	runStartScript, runAdmitScript, runGetScript, runEndScript, runSettleScript,
}

// LoadScripts loads every script into the store's script cache, so the first
// calls need no EVAL fallback, and a store that cannot run them is found at
// start-up. Scripts evicted later (SCRIPT FLUSH, a restart, a failover) are
// sent again by the EVALSHA fallback on their next call.
func (l *Ledger) LoadScripts(ctx context.Context) error {
	for _, s := range allScripts {
		if err := s.Load(ctx, l.rdb).Err(); err != nil {
			return storeError("ledger.LoadScripts", err)
		}
	}
	return nil
}

func newScript(body string) *redis.Script {
	return redis.NewScript(commonLua + "\n" + body)
}

func newRunScript(body string) *redis.Script {
	return redis.NewScript(runsLua + "\n" + body)
}

// Script return codes (C_* in common.lua).
const (
	codeOK                 = 0
	codeExecute            = 1
	codeReplay             = 2
	codeInProgress         = 3
	codeReconcile          = 4
	codeNotFound           = 10
	codeExpired            = 11
	codeKeyReused          = 12
	codeStale              = 13
	codeCompletionConflict = 14
	codeAlreadyResolved    = 15
	codeBusy               = 16
	codeFields             = 17
	codeQuota              = 18
	codeRunEnded           = 19
	codeUngoverned         = 20
	codeNotCompensable     = 21
)
