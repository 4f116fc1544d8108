package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/opledger/ledger/client"
)

// probe is the reconciler of a tool with a probe: it asks the upstream's
// lookup tool for the effect by its idempotency key (the operation id).
// Found, the lookup's answer is recorded as the result; "found": false is
// not applied, once the operation has been unresolved for not_found_after
// (an attempt still on its way may yet apply it); any other answer leaves
// the operation unknown. An operation escalated to a human is left to one.
func (g *Gateway) probe(t *tool) client.Reconciler {
	pc := t.policy.probe
	return func(ctx context.Context, op *client.Operation) (client.Finding, error) {
		if op.NeedsReview {
			return client.Finding{}, errors.New("escalated to a human, who settles it")
		}
		args := map[string]any{pc.Argument: op.ID}
		res, err := t.up.call(ctx, &mcp.CallToolParams{Name: pc.Tool, Arguments: args}, nil)
		if errors.Is(err, mcp.ErrConnectionClosed) {
			// The session had ended (a stdio upstream that died): a
			// lookup is safe to send again, on a new one.
			res, err = t.up.call(ctx, &mcp.CallToolParams{Name: pc.Tool, Arguments: args}, nil)
		}
		switch {
		case err != nil:
			return client.Finding{}, fmt.Errorf("probe %s: %w", pc.Tool, err)
		case res.IsError:
			return client.Finding{}, fmt.Errorf("probe %s answered an error", pc.Tool)
		case !notFound(res):
			return client.Finding{Kind: client.Applied, Result: record(res, t.policy.resourceID), Note: "found by probe " + pc.Tool}, nil
		}
		since := op.UnknownSince
		if since.IsZero() {
			since = op.LeaseExpiresAt
		}
		if wait := time.Duration(pc.NotFoundAfter); time.Since(since) < wait {
			return client.Finding{}, fmt.Errorf("probe %s found nothing yet; an attempt still on its way may apply it until %s", pc.Tool, since.Add(wait).Format(time.RFC3339))
		}
		return client.Finding{Kind: client.NotApplied, Note: "not found by probe " + pc.Tool}, nil
	}
}

// notFound reports whether a lookup answered that there is no effect:
// structured content {"found": false}.
func notFound(res *mcp.CallToolResult) bool {
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		return false
	}
	found, ok := m["found"].(bool)
	return ok && !found
}

// reconcileLoop settles, every interval until ctx ends, the unresolved
// operations of the tools with a probe.
func (g *Gateway) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(time.Duration(g.cfg.Reconcile.Interval))
	defer t.Stop()
	for {
		g.reconcileOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcileOnce runs one pass, under each reconciler key.
func (g *Gateway) reconcileOnce(ctx context.Context) {
	var probed []*tool
	g.mu.Lock()
	for _, t := range g.tools {
		if t.policy.probe != nil && t.policy.key != keyNone {
			probed = append(probed, t)
		}
	}
	g.mu.Unlock()
	if len(probed) == 0 {
		return
	}
	keys := g.cfg.Reconcile.apiKeys
	if len(keys) == 0 {
		keys = []string{g.cfg.Ledger.apiKey}
	}
	for _, key := range keys {
		lc := g.ledger(key)
		for _, t := range probed {
			if err := g.reconcileTool(ctx, lc, t); err != nil && ctx.Err() == nil {
				g.log.Warn("background reconciliation", "tool", t.name, "error", err)
			}
		}
	}
}

// reconcileTool probes the tool's operations that are unknown, or running
// past their lease, and records what the probe finds.
func (g *Gateway) reconcileTool(ctx context.Context, lc *client.Client, t *tool) error {
	probe := g.probe(t)
	opts := client.ListOptions{Tool: t.name, States: []client.State{client.StateUnknown, client.StateRunning}}
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		page, err := lc.ListUnresolved(cctx, opts)
		cancel()
		if err != nil {
			return err
		}
		for _, op := range page.Operations {
			if op.NeedsReview || op.State == client.StateRunning && time.Now().Before(op.LeaseExpiresAt) {
				continue
			}
			pctx, cancel := context.WithTimeout(ctx, t.policy.timeout)
			f, err := probe(pctx, op)
			cancel()
			if err != nil {
				g.log.Info("operation left unresolved", "tool", t.name, "operation_id", op.ID, "reason", err)
				continue
			}
			f.FencingToken = op.FencingToken
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = lc.Reconcile(rctx, op.ID, f)
			cancel()
			if err != nil && !errors.Is(err, client.ErrAlreadyResolved) && !errors.Is(err, client.ErrStaleToken) {
				return fmt.Errorf("recording the finding about %s: %w", op.ID, err)
			}
			g.log.Info("operation reconciled", "tool", t.name, "operation_id", op.ID, "finding", f.Kind.String())
		}
		if page.NextPageToken == "" {
			return nil
		}
		opts.PageToken = page.NextPageToken
	}
}
