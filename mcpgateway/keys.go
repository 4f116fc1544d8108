package mcpgateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
)

// The _meta keys the gateway reads from a call and writes to the forward
// and the answer (docs/mcp.md).
const (
	// MetaOperationID (or MetaIdempotencyKey) is the call's operation id.
	MetaOperationID    = "io.github.opledger/operationId"
	MetaIdempotencyKey = "idempotencyKey"
	// MetaRunID scopes the operation ids the session mode derives.
	MetaRunID = "io.github.opledger/runId"
	// MetaPermitID is the permit the call acts under.
	MetaPermitID = "io.github.opledger/permitId"
	// MetaFencingToken is the attempt's token, sent to the upstream.
	MetaFencingToken = "io.github.opledger/fencingToken"
	// MetaLedger is the object an answer carries: operationId, outcome,
	// replayed, attempt.
	MetaLedger = "io.github.opledger/ledger"
)

// callMeta is what a call's _meta tells the gateway.
type callMeta struct {
	key, runID, permitID string
}

// readMeta reads the gateway's keys from a call's _meta; a key that is not
// a non-empty string, or two operation ids that differ, are refused.
func readMeta(m mcp.Meta) (callMeta, error) {
	var c callMeta
	var err error
	get := func(k string) string {
		v, ok := m[k]
		if !ok || v == nil || err != nil {
			return ""
		}
		s, ok := v.(string)
		if !ok || s == "" {
			err = fmt.Errorf("_meta[%q] must be a non-empty string", k)
		}
		return s
	}
	own, std := get(MetaOperationID), get(MetaIdempotencyKey)
	c.runID, c.permitID = get(MetaRunID), get(MetaPermitID)
	if err != nil {
		return c, err
	}
	if own != "" && std != "" && own != std {
		return c, fmt.Errorf("_meta[%q] and _meta[%q] differ: send one", MetaOperationID, MetaIdempotencyKey)
	}
	c.key = own
	if c.key == "" {
		c.key = std
	}
	return c, nil
}

// passedMeta is the caller's _meta as an upstream gets it: without the
// gateway's own keys, and without the progress token and the protocol's
// reserved keys, which belong to the caller's hop (a forward has its own).
func passedMeta(in mcp.Meta) mcp.Meta {
	out := mcp.Meta{}
	for k, v := range in {
		switch k {
		case MetaOperationID, MetaIdempotencyKey, MetaRunID, MetaPermitID, MetaFencingToken, "progressToken":
			continue
		}
		if reservedMeta(k) {
			continue
		}
		out[k] = v
	}
	return out
}

// reservedMeta reports whether a _meta key is the protocol's own: its
// prefix has a label mcp or modelcontextprotocol (io.modelcontextprotocol/).
func reservedMeta(k string) bool {
	prefix, _, ok := strings.Cut(k, "/")
	if !ok {
		return false
	}
	for _, label := range strings.Split(prefix, ".") {
		if label == "mcp" || label == "modelcontextprotocol" {
			return true
		}
	}
	return false
}

// forwardMeta is the _meta of a recorded call's forward: the caller's,
// with the operation id as the upstream's idempotency key and the
// attempt's fencing token.
func forwardMeta(in mcp.Meta, a client.Attempt) mcp.Meta {
	out := passedMeta(in)
	out[MetaIdempotencyKey] = a.IdempotencyKey
	out[MetaOperationID] = a.OperationID
	out[MetaFencingToken] = strconv.FormatUint(a.FencingToken, 10)
	return out
}

// intentBase is the stem of the operation ids of one intent: a tool called
// with the same consequential arguments in one scope (a run or a session).
func intentBase(tool, scope string, fp fingerprint.Fingerprint) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(tool))
	h.Write([]byte{0})
	h.Write(fp[:])
	return "mcp:" + tool + ":" + hex.EncodeToString(h.Sum(nil)[:16])
}

// intents maps session-mode calls to operation ids: base:1, base:2, ...,
// one per intent. A call takes the latest that is unsettled, or settled
// less than the window ago; after that, the next one.
type intents struct {
	mu   sync.Mutex
	last map[string]int // the latest ordinal seen per base: where a lookup starts
}

// maxIntents bounds the hints kept; past it they are dropped, and a call
// looks up from 1 again.
const maxIntents = 10000

// maxScan bounds the lookups of one call.
const maxScan = 1000

// resolve returns the operation id of a call of intent base, looking the
// ordinals up in the ledger from the latest one known here.
func (in *intents) resolve(ctx context.Context, lc *client.Client, base string, window time.Duration) (string, error) {
	n := in.start(base)
	for range maxScan {
		id := base + ":" + strconv.Itoa(n)
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		o, err := lc.Lookup(cctx, id)
		cancel()
		switch {
		case errors.Is(err, client.ErrNotFound):
		case errors.Is(err, client.ErrKeyExpired):
			n++
			continue
		case err != nil:
			return "", err
		case settled(o.State) && time.Since(o.UpdatedAt) >= window:
			n++
			continue
		}
		in.remember(base, n)
		return id, nil
	}
	return "", fmt.Errorf("%d earlier intents of this call in this session: send an operation id in _meta", maxScan)
}

func (in *intents) start(base string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return max(in.last[base], 1)
}

func (in *intents) remember(base string, n int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.last == nil || len(in.last) >= maxIntents {
		in.last = map[string]int{}
	}
	in.last[base] = max(in.last[base], n)
}

// settled reports whether a state is terminal.
func settled(s client.State) bool {
	return s == client.StateSucceeded || s == client.StateFailedFinal
}
