package ledger

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Every state change is one of these scripts: atomic on the store, no
// read-modify-write from Go. Each file documents its KEYS, ARGV and returns;
// common.lua (and runs.lua, for the run scripts) documents the conventions
// they share.
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
	//go:embed scripts/prune.lua
	pruneLua string
)

// script is one ledger script, in its two forms: the prelude, begin() and
// the body as one text (EVALSHA, with the EVAL fallback), and the body as
// the function fn of the library (FCALL).
type script struct {
	*redis.Script
	name, prelude, body string
	fn                  string // set by buildLibrary
}

var (
	reserveScript     = newScript("reserve", commonLua, reserveLua)
	completeScript    = newScript("complete", commonLua, completeLua)
	markUnknownScript = newScript("mark_unknown", commonLua, markUnknownLua)
	renewScript       = newScript("renew", commonLua, renewLua)
	reconcileScript   = newScript("reconcile", commonLua, reconcileLua)
	expireScript      = newScript("expire", commonLua, expireLua)
	lookupScript      = newScript("lookup", commonLua, lookupLua)
	compactScript     = newScript("compact", commonLua, compactLua)
	compensateScript  = newScript("compensate", commonLua, compensateLua)
	pruneScript       = newScript("prune", commonLua, pruneLua)
	runStartScript    = newScript("run_start", runsLua, runStartLua)
	runAdmitScript    = newScript("run_admit", runsLua, runAdmitLua)
	runGetScript      = newScript("run_get", runsLua, runGetLua)
	runEndScript      = newScript("run_end", runsLua, runEndLua)
	runSettleScript   = newScript("run_settle", runsLua, runSettleLua)
)

var allScripts = []*script{
	reserveScript, completeScript, markUnknownScript, renewScript,
	reconcileScript, expireScript, lookupScript, compactScript, compensateScript, pruneScript,
	runStartScript, runAdmitScript, runGetScript, runEndScript, runSettleScript,
}

// library is the text FUNCTION LOAD takes: every script as a function.
var library = buildLibrary(allScripts)

func newScript(name, prelude, body string) *script {
	return &script{Script: redis.NewScript(prelude + "\nbegin()\n" + body), name: name, prelude: prelude, body: body}
}

// buildLibrary returns the library of scripts and names each one's
// function. The library's name, and so every function's, carries a digest
// of its text: two ledger versions sharing a store (a rolling upgrade) load
// two libraries side by side instead of replacing each other's. Each
// prelude is in a block of its own, with the functions of its scripts;
// KEYS and ARGV are the library's locals, set by each call.
func buildLibrary(scripts []*script) string {
	sum := sha1.New()
	for _, s := range scripts {
		fmt.Fprintf(sum, "%s\x00%s\x00%s\x00", s.name, s.prelude, s.body)
	}
	name := "opledger_" + hex.EncodeToString(sum.Sum(nil))[:12]
	var b strings.Builder
	fmt.Fprintf(&b, "#!lua name=%s\nlocal KEYS, ARGV\n", name)
	prelude := ""
	for _, s := range scripts {
		if s.prelude != prelude {
			if prelude != "" {
				b.WriteString("end\n")
			}
			prelude = s.prelude
			b.WriteString("do\n" + prelude + "\n")
		}
		s.fn = name + "_" + s.name
		fmt.Fprintf(&b, "redis.register_function('%s', function(k, a)\nKEYS, ARGV = k, a\nbegin()\n%s\nend)\n", s.fn, s.body)
	}
	b.WriteString("end\n")
	return b.String()
}

// LoadScripts loads the library into the store (on every master of a
// Cluster), or where the store has no Functions (the embedded engine, or a
// user without FUNCTION LOAD) every script into its script cache; so the
// first calls need no fallback, and a store that cannot run them is found
// at start-up. A library or script missing later (a restart without
// persistence, FUNCTION FLUSH, SCRIPT FLUSH) is sent again by the call
// that finds it missing.
func (l *Ledger) LoadScripts(ctx context.Context) error {
	if !l.noFunctions.Load() {
		err := l.loadLibrary(ctx)
		if err == nil {
			return nil
		}
		if !withoutFunctions(err) {
			return storeError("ledger.LoadScripts", err)
		}
		l.noFunctions.Store(true)
	}
	for _, s := range allScripts {
		if err := s.Load(ctx, l.rdb).Err(); err != nil {
			return storeError("ledger.LoadScripts", err)
		}
	}
	return nil
}

// loadLibrary loads the library on the store, on every master of a
// Cluster. A library already loaded is no error.
func (l *Ledger) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Cmdable) error {
		err := c.FunctionLoad(ctx, library).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, l.rdb)
}

// withoutFunctions reports an error that says the store cannot run the
// library: no FCALL or FUNCTION (the embedded engine, Redis before 7), or
// a user whose ACL lacks them.
func withoutFunctions(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := strings.ToLower(rerr.Error())
	if strings.HasPrefix(msg, "noperm") {
		return strings.Contains(msg, "'fcall'") || strings.Contains(msg, "'function")
	}
	return strings.HasPrefix(msg, "err unknown command")
}

// way is how a script is sent: FCALL of its function (again after the
// library was loaded), EVALSHA, or EVAL with its whole text.
type way int

const (
	wayFCall way = iota
	wayFCallLoaded
	wayEvalSha
	wayEval
)

// first returns the way to send a script first.
func (l *Ledger) first() way {
	if l.noFunctions.Load() {
		return wayEvalSha
	}
	return wayFCall
}

// send queues s on c (a client or a pipeline) the way w.
func (s *script) send(ctx context.Context, c redis.Cmdable, w way, keys []string, args []any) *redis.Cmd {
	switch w {
	case wayFCall, wayFCallLoaded:
		return c.FCall(ctx, s.fn, keys, args...)
	case wayEvalSha:
		return s.EvalSha(ctx, c, keys, args...)
	default:
		return s.Eval(ctx, c, keys, args...)
	}
}

// next returns the way to send a script again after it was sent the way w
// and refused with err, which says that it did not run; false when err
// stands. A missing library is loaded first. The EVALSHA way stays when the
// store has no Functions, and serves a call refused for want of memory: a
// function that may write is refused before it runs, a script only at its
// first write (so a replay still answers; design.md, "Out of memory").
func (l *Ledger) next(ctx context.Context, w way, err error) (way, bool) {
	switch {
	case err == nil:
		return w, false
	case w <= wayFCallLoaded && withoutFunctions(err):
		l.noFunctions.Store(true)
		return wayEvalSha, true
	case w <= wayFCallLoaded && redis.HasErrorPrefix(err, "OOM"):
		return wayEvalSha, true
	case w == wayFCall && redis.HasErrorPrefix(err, "Function not found"):
		if lerr := l.loadLibrary(ctx); lerr != nil {
			if withoutFunctions(lerr) {
				l.noFunctions.Store(true)
			}
			return wayEvalSha, true
		}
		return wayFCallLoaded, true
	case w == wayFCallLoaded && redis.HasErrorPrefix(err, "Function not found"):
		// Gone again at once (FUNCTION FLUSH, a failover): the script
		// itself does not depend on the library.
		return wayEvalSha, true
	case w == wayEvalSha && redis.HasErrorPrefix(err, "NOSCRIPT"):
		return wayEval, true
	}
	return w, false
}

// try sends a script with do, the first way, then again as next says for
// as long as do's error says that the script did not run.
func (l *Ledger) try(ctx context.Context, do func(way) error) {
	w := l.first()
	for err := do(w); err != nil; err = do(w) {
		var again bool
		if w, again = l.next(ctx, w, err); !again {
			return
		}
	}
}

// call runs s on c and returns its reply.
func (l *Ledger) call(ctx context.Context, c redis.Cmdable, s *script, keys []string, args []any) (res []any, err error) {
	l.try(ctx, func(w way) error {
		res, err = s.send(ctx, c, w, keys, args).Slice()
		return err
	})
	return res, err
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
