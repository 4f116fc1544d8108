package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/jsonvalue"
)

// The outcomes an answer's MetaLedger object names (docs/mcp.md).
const (
	outcomeExecuted     = "executed"
	outcomeReplayed     = "replayed"
	outcomeUnrecorded   = "unrecorded"
	outcomeNotRecorded  = "not_recorded"
	outcomeConflict     = "conflicting_outcome"
	outcomeKeyReused    = "key_reused"
	outcomeKeyExpired   = "key_expired"
	outcomeKeyRequired  = "key_required"
	outcomeUnknown      = "unknown"
	outcomeInProgress   = "in_progress"
	outcomeNotApplied   = "not_applied"
	outcomeUnavailable  = "unavailable"
	outcomeRefused      = "refused"
	outcomeInvalid      = "invalid_request"
	outcomeMisconfigure = "misconfigured"
	outcomeRunEnded     = "run_ended"
)

// handler serves calls of the tool served as name.
func (g *Gateway) handler(name string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		t := g.tool(name)
		if t == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q", name)}
		}
		start := time.Now()
		var res *mcp.CallToolResult
		if _, closing := g.stopping.Load(req.Session); closing {
			res = refusal("", outcomeUnavailable, "Not executed: the gateway is stopping. Send the same call again: another instance, or this one restarted, takes it.")
		} else {
			res = g.call(ctx, t, req)
		}
		tenant := ""
		if g.metrics.tenant {
			tenant = g.callerTenant(ctx, req)
		}
		g.metrics.observe(name, tenant, res, start)
		return res, nil
	}
}

// call runs one tool call through the ledger (or, for a read-only tool
// left unrecorded, straight to the upstream) and returns the answer.
func (g *Gateway) call(ctx context.Context, t *tool, req *mcp.CallToolRequest) *mcp.CallToolResult {
	meta, err := readMeta(req.Params.Meta)
	if err != nil {
		return refusal("", outcomeInvalid, "Not executed: "+err.Error()+".")
	}
	args, err := arguments(req.Params.Arguments)
	if err != nil {
		return refusal("", outcomeInvalid, "Not executed: the arguments must be a JSON object.")
	}
	p := t.policy
	if p.key == keyNone {
		return g.unrecorded(ctx, t, req)
	}
	params, err := jsonvalue.Params(selectParams(args, p.params))
	if err != nil {
		return refusal("", outcomeInvalid, "Not executed: the arguments cannot be fingerprinted exactly ("+err.Error()+"); send large integers as strings.")
	}
	lc := g.ledger(g.callerKey(req))
	id := meta.key
	if id == "" {
		if p.key == keyRequire {
			return refusal("", outcomeKeyRequired, fmt.Sprintf("Not executed: %s needs an idempotency key. Send _meta {%q: \"<an id minted once for this action, reused on every retry of it>\"} with the call.", t.name, MetaIdempotencyKey))
		}
		if id, err = g.derive(ctx, lc, t, req, meta, params); err != nil {
			return ledgerFailure("", err)
		}
	}
	// The run is the caller's (_meta), else its session's: the ledger's
	// run guard counts the calls of either.
	run := meta.runID
	if run == "" {
		run = g.sessionScope(req)
	}
	op := client.Op{ID: id, Tool: t.name, Params: params, PermitID: meta.permitID, RunID: run, Effect: p.effect}
	// The tool list, and so a tool's policy, may change while the
	// gateway runs: the client gets them with each call.
	lc.SetToolPolicy(t.name, p.clientPolicy())
	var probe client.Reconciler
	if p.probe != nil {
		probe = g.probe(t)
	}
	lc.RegisterReconciler(t.name, probe)
	var f forwards
	res, err := lc.Do(client.WithWaitDeadline(ctx, time.Now().Add(p.wait)), op, g.attempt(t, req, &f))
	if errors.Is(err, client.ErrRunEnded) {
		return runEnded(id, run, err)
	}
	return g.answer(ctx, t, id, res, err, &f)
}

// forwards is what the attempts of one call did: the tool's last answer,
// and whether a forward ended with its outcome unknown (no answer, or a
// failure that does not prove nothing ran): a later attempt proven not
// applied does not undo what an earlier one may have done.
type forwards struct {
	executed *mcp.CallToolResult
	unknown  bool
}

// attempt is Do's fn for a call of t: one forward to the upstream, noted
// in f.
func (g *Gateway) attempt(t *tool, req *mcp.CallToolRequest, f *forwards) func(context.Context, client.Attempt) (client.Result, error) {
	p := t.policy
	return func(ctx context.Context, a client.Attempt) (client.Result, error) {
		out, err := t.up.call(ctx, g.forward(t, req, &a), g.relay(req))
		f.unknown = f.unknown || err != nil && client.ClassOf(err) == client.Ambiguous
		if err != nil {
			return client.Result{}, err
		}
		f.executed = out
		switch {
		case !out.IsError:
			return record(out, p.resourceID), nil
		case p.retryable:
			return client.Result{}, client.MarkRetryable(&toolError{out})
		}
		return client.Result{}, client.MarkFinalDetail("tool_error", errorText(out), &toolError{out})
	}
}

// derive returns the operation id of a call that names none: the
// session's (or run's) intent for the tool and its consequential
// arguments, within the dedupe window.
func (g *Gateway) derive(ctx context.Context, lc *client.Client, t *tool, req *mcp.CallToolRequest, meta callMeta, params map[string]any) (string, error) {
	fp, err := fingerprint.Compute(params, nil)
	if err != nil {
		return "", err
	}
	scope := meta.runID
	if scope == "" {
		scope = g.sessionScope(req)
	}
	return g.intents.resolve(ctx, lc, intentBase(t.name, scope, fp), t.policy.window)
}

// sessionScope names the session a call came in: its Streamable HTTP
// session, or the stdio connection.
func (g *Gateway) sessionScope(req *mcp.CallToolRequest) string {
	if id := req.Session.ID(); id != "" {
		return "http-" + id
	}
	return g.stdioScope
}

// unrecorded forwards a call of a read-only tool without the ledger.
func (g *Gateway) unrecorded(ctx context.Context, t *tool, req *mcp.CallToolRequest) *mcp.CallToolResult {
	if t.policy.effect != client.EffectReadOnly {
		g.log.Error("key none on a tool that is not read-only: calls refused", "tool", t.name)
		return refusal("", outcomeMisconfigure, "Not executed: the gateway is configured to leave this tool unrecorded, which it only does for read-only tools. An operator must fix its policy.")
	}
	out, err := t.up.call(ctx, g.forward(t, req, nil), g.relay(req))
	if err != nil {
		return refusal("", outcomeUnrecorded, "No answer: "+upstreamText(err)+".")
	}
	return annotate(out, "", outcomeUnrecorded, 0)
}

// forward is the upstream's request for a call: its arguments as sent,
// and its _meta with the operation id and the attempt's token.
func (g *Gateway) forward(t *tool, req *mcp.CallToolRequest, a *client.Attempt) *mcp.CallToolParams {
	p := &mcp.CallToolParams{Name: t.remote, Arguments: rawArguments(req.Params.Arguments)}
	if a != nil {
		p.Meta = forwardMeta(req.Params.Meta, *a)
	} else if m := passedMeta(req.Params.Meta); len(m) > 0 {
		p.Meta = m
	}
	return p
}

// relay passes the upstream's progress on to the caller, when it asked
// for progress.
func (g *Gateway) relay(req *mcp.CallToolRequest) func(context.Context, *mcp.ProgressNotificationParams) {
	tok := req.Params.GetProgressToken()
	if tok == nil {
		return nil
	}
	return func(ctx context.Context, p *mcp.ProgressNotificationParams) {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: tok, Progress: p.Progress, Total: p.Total, Message: p.Message,
		})
	}
}

// toolError carries an upstream's isError result through Do.
type toolError struct{ res *mcp.CallToolResult }

func (e *toolError) Error() string { return "the tool answered an error" }

// arguments decodes a call's arguments: a JSON object, or none.
func arguments(raw json.RawMessage) (map[string]any, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return map[string]any{}, nil
	}
	return decodeObject(raw)
}

// fit is fitted, for an answer of t under operation id. An answer whose
// structured content is not kept is counted and logged, without its
// content, which may quote the request.
func (g *Gateway) fit(t *tool, id string, res *mcp.CallToolResult) *mcp.CallToolResult {
	out, why := fitted(res, t.output)
	if why != "" {
		g.metrics.asText.WithLabelValues(t.name, why).Inc()
		g.log.Warn("answer given without its structured content: not in the tool's output schema's shape",
			"tool", t.name, "operation_id", id, "reason", why)
	}
	return out
}

// answer turns what Do returned into the caller's answer.
func (g *Gateway) answer(ctx context.Context, t *tool, id string, res client.Result, err error, f *forwards) *mcp.CallToolResult {
	executed := f.executed
	var (
		nr *client.NotRecordedError
		co *client.ConflictingOutcomeError
		fe *client.FailedError
		ex *client.ExhaustedError
		re *client.ReconcileError
		wd *client.WaitDeadlineError
		te *toolError
	)
	switch {
	case err == nil && !res.Replayed && executed != nil:
		return annotate(g.fit(t, id, executed), id, outcomeExecuted, res.Attempt)
	case err == nil:
		return annotate(g.fit(t, id, replayed(res, t.output)), id, outcomeReplayed, res.Attempt)
	case errors.As(err, &nr) && executed != nil:
		g.log.Warn("an effect happened but the ledger did not record it", "operation_id", id, "error", nr.Err)
		return annotate(g.fit(t, id, executed), id, outcomeNotRecorded, 0)
	case errors.As(err, &co) && executed != nil:
		g.log.Error("an effect happened but the ledger records another outcome: a human must look", "operation_id", id)
		return annotate(g.fit(t, id, executed), id, outcomeConflict, co.Attempt)
	case errors.As(err, &fe) && !fe.Replayed && errors.As(fe.Err, &te):
		return annotate(g.fit(t, id, te.res), id, outcomeExecuted, 0)
	case errors.As(err, &fe):
		return annotate(failed(fe), id, outcomeReplayed, 0)
	case errors.As(err, &ex) && ex.Ambiguous, errors.As(err, &re):
		return unknown(id, re != nil && re.Escalated, err)
	case errors.As(err, &ex) && errors.As(ex.Err, &te):
		return annotate(g.fit(t, id, te.res), id, outcomeNotApplied, 0)
	case errors.As(err, &ex):
		return refusal(id, outcomeNotApplied, "The tool did not run, and nothing was applied: "+upstreamText(ex.Err)+". The same call may be sent again.")
	case errors.As(err, &wd):
		return refusal(id, outcomeInProgress, "Not executed here: another call of this operation is still running. Send the same call again later to get its outcome; do not change its arguments or key.")
	case errors.Is(err, client.ErrKeyReused):
		return refusal(id, outcomeKeyReused, keyReusedText(id, err))
	case errors.Is(err, client.ErrKeyExpired):
		return refusal(id, outcomeKeyExpired, fmt.Sprintf("Not executed: operation %q ran long ago and its record has expired; it is not run again. A human or planner must decide whether a new action is wanted, under a new key.", id))
	case f.unknown:
		// The ledger could not record even that the outcome is unknown.
		g.log.Warn("a forward's outcome is unknown and the ledger did not record it", "operation_id", id, "error", err)
		return unknown(id, false, err)
	case ctx.Err() != nil:
		return refusal(id, outcomeUnknown, "The call was cancelled.")
	}
	return ledgerFailure(id, err)
}

// ledgerFailure is the answer to a call the ledger did not take.
func ledgerFailure(id string, err error) *mcp.CallToolResult {
	var le *client.Error
	switch {
	case errors.Is(err, client.ErrUnavailable):
		return refusal(id, outcomeUnavailable, "Not executed: the operation ledger could not be reached, and nothing runs without it. Send the same call again later.")
	case errors.Is(err, client.ErrUnauthenticated), errors.Is(err, client.ErrPermissionDenied):
		return refusal(id, outcomeRefused, "Not executed: the ledger refused the gateway's credentials for this call ("+err.Error()+").")
	case errors.Is(err, client.ErrRateLimited), errors.Is(err, client.ErrQuotaExceeded):
		return refusal(id, outcomeRefused, "Not executed: "+err.Error()+". Wait before sending the same call again.")
	case errors.As(err, &le) && len(le.Violations) > 0:
		return refusal(id, outcomeInvalid, "Not executed: the ledger refused the request: "+le.Violations[0].Field+" "+le.Violations[0].Description+".")
	}
	return refusal(id, outcomeRefused, "Not executed: "+err.Error()+".")
}

// runEnded is the answer to a call the ledger's run guard refused: the
// run has ended (its state and, when this call reached it, the limit are
// in the answer's ledger object as runState and limit).
func runEnded(id, run string, err error) *mcp.CallToolResult {
	rr, _ := client.RunOf(err)
	state := strings.ToLower(strings.TrimPrefix(rr.State.String(), "RUN_STATE_"))
	why := "it was ended"
	switch rr.State {
	case client.RunStepLimit:
		why = "it used up its tool calls"
	case client.RunDeadline:
		why = "its deadline passed"
	case client.RunRepetition:
		why = "it called one tool with the same arguments too often"
	}
	res := refusal(id, outcomeRunEnded, fmt.Sprintf("Not executed: the agent run %q has ended (%s: %s), and the ledger admits no new tool call in it. Stop the run and report what was done; do not send this call again, under this key or a new one.", run, state, why))
	m := res.Meta[MetaLedger].(map[string]any)
	m["runState"] = state
	if rr.Limit != "" {
		m["limit"] = rr.Limit
	}
	return res
}

// unknown is the answer to a call whose effect may or may not exist.
func unknown(id string, escalated bool, err error) *mcp.CallToolResult {
	text := fmt.Sprintf("The outcome of operation %q is unknown: the tool may or may not have applied it, so it is not run again until that is settled. ", id)
	if escalated {
		text += "A human has been asked to settle it."
	} else {
		text += "Send the same call again later to get its outcome (it is reconciled with the tool server where the gateway can ask it, or by an operator); do not change its arguments or key to get around this."
	}
	return refusal(id, outcomeUnknown, text)
}

// keyReusedText says what to do when a key is bound to another request.
func keyReusedText(id string, err error) string {
	what := "its arguments"
	var le *client.Error
	if errors.As(err, &le) && le.Metadata["differs"] != "" {
		what = "its " + le.Metadata["differs"]
	}
	return fmt.Sprintf("Not executed: the key %q already belongs to a different request (%s differ). If this call is a retry of that request, send its original arguments unchanged. Only if it is a new action, send a new key; never reuse a key for a different request.", id, what)
}

// upstreamText says why a forward failed, without its arguments.
func upstreamText(err error) string {
	var (
		r  *refusedError
		te *toolError
		ue *unreachableError
	)
	switch {
	case errors.As(err, &r):
		return r.Error()
	case errors.As(err, &te):
		if t := errorText(te.res); t != "" {
			return "the tool answered: " + t
		}
		return "the tool answered an error"
	case errors.As(err, &ue), errors.Is(err, syscall.ECONNREFUSED):
		return "the tool server could not be reached"
	}
	return "the tool server gave no answer"
}

// refusal is an isError answer with text for the model.
func refusal(id, outcome, text string) *mcp.CallToolResult {
	return annotate(&mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}}, id, outcome, 0)
}

// annotate adds the gateway's MetaLedger object to an answer.
func annotate(res *mcp.CallToolResult, id, outcome string, attempt uint32) *mcp.CallToolResult {
	out := *res
	out.Meta = mcp.Meta{}
	for k, v := range res.Meta {
		out.Meta[k] = v
	}
	m := map[string]any{"outcome": outcome, "replayed": outcome == outcomeReplayed}
	if id != "" {
		m["operationId"] = id
	}
	if attempt > 0 {
		m["attempt"] = attempt
	}
	out.Meta[MetaLedger] = m
	return &out
}
