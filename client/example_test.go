package client_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"time"

	"google.golang.org/grpc"

	"github.com/opledger/ledger/client"
)

// The examples hold the Go snippets of docs/client.md: each snippet is in
// an example's body as the page shows it (TestDocsGoSnippetsAreExamples),
// so go vet and go test compile it. They have no output: they need a
// ledger to talk to. What the snippets leave to the reader (a refunds API,
// a reconciler, the ids) is declared here.

// refundsAPI is a destination's client, as the snippet uses it.
type refundsAPI struct{}

// Create would ask the refunds API for a refund under key.
func (refundsAPI) Create(ctx context.Context, charge string, amount int, key string) (*http.Response, error) {
	return nil, errors.New("no refunds API in an example")
}

var refunds refundsAPI

// findRefundByOperationID would ask the refunds API whether op's refund
// exists.
func findRefundByOperationID(ctx context.Context, op *client.Operation) (client.Finding, error) {
	return client.Finding{Kind: client.Escalate}, nil
}

// Example is the first snippet of docs/client.md: Do around a refund.
func Example() {
	ctx := context.Background()
	runID, callID, approvalID := "wf-8472", "call-3", "approval-77"

	c, err := client.Dial("127.0.0.1:50051",
		client.WithToolPolicy("create_refund", client.ToolPolicy{Timeout: 10 * time.Second, MaxRetries: 1}),
		client.WithReconciler("create_refund", findRefundByOperationID),
	)
	if err != nil {
		log.Fatal(err) // a target gRPC cannot parse, or WithAPIKey without TLS beyond this machine
	}
	defer c.Close()
	res, err := c.Do(ctx, client.Op{
		ID:       runID + ":" + callID, // minted once, reused by every retry
		Tool:     "create_refund",
		Params:   map[string]any{"charge": "ch_1", "amount": 1250},
		PermitID: approvalID,
	}, func(ctx context.Context, a client.Attempt) (client.Result, error) {
		resp, err := refunds.Create(ctx, "ch_1", 1250, a.IdempotencyKey)
		if err := client.ClassifyHTTP(resp, err); err != nil {
			return client.Result{}, err
		}
		return client.Result{ResourceID: resp.Header.Get("Refund-Id")}, nil
	})
	switch {
	case err == nil: // res.Replayed says whether this call ran it
	case errors.Is(err, client.ErrKeyReused): // stop: the request changed under the same key
	case errors.Is(err, client.ErrNeedsReconciliation): // stop: a human or reconciler must settle it
	case errors.Is(err, client.ErrUnavailable): // the ledger is down: retry later with the same op
	}
	_ = res
}

// ExampleDial_roundRobin is docs/client.md's "Several ledgerd instances":
// a client that spreads its calls over every instance a name resolves to.
func ExampleDial_roundRobin() {
	c, err := client.Dial("dns:///ledger.internal:50051",
		client.WithDialOptions(grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`)),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}

// ExampleWithWaitDeadline is docs/client.md's "Bounding the waits": a
// budget for Do's waits that never cuts a running tool.
func ExampleWithWaitDeadline() {
	ctx := context.Background()
	runDeadline := time.Now().Add(time.Minute)
	var c *client.Client
	op := client.Op{ID: "wf-8472:call-3", Tool: "create_refund"}
	fn := func(ctx context.Context, a client.Attempt) (client.Result, error) { return client.Result{}, nil }

	res, err := c.Do(client.WithWaitDeadline(ctx, runDeadline), op, fn)
	var wd *client.WaitDeadlineError
	if errors.As(err, &wd) { // errors.Is(err, client.ErrWaitDeadline)
		// out of time: the operation is as the ledger has it (wd.Operation); retry later, same op
	}
	_ = res
}

// ExampleClient_StartRun is docs/client.md's "Runs": a run whose new
// operations the ledger counts and caps.
func ExampleClient_StartRun() {
	ctx := context.Background()
	var c *client.Client
	p := map[string]any{"charge": "ch_1", "amount": 1250}
	fn := func(ctx context.Context, a client.Attempt) (client.Result, error) { return client.Result{}, nil }

	run, err := c.StartRun(ctx, "run-42", client.RunLimits{MaxSteps: 20, Deadline: 10 * time.Minute, MaxRepeats: 2})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Do(ctx, client.Op{ID: "run-42:call-7", Tool: "payments.refund", Params: p, RunID: run.ID}, fn)
	if rr, ok := client.RunOf(err); ok { // errors.Is(err, client.ErrRunEnded)
		log.Println("the run ended:", rr.State, rr.Limit) // RunStepLimit "max_steps", RunDeadline, RunRepetition, RunDone, RunCancelled
	}
	_ = res
}

// ExampleClient_Do_compensation is docs/client.md's "Compensations": a
// refund that reverses a charge.
func ExampleClient_Do_compensation() {
	ctx := context.Background()
	var c *client.Client
	p := map[string]any{"charge": "ch_1", "amount": 1250}
	fn := func(ctx context.Context, a client.Attempt) (client.Result, error) { return client.Result{}, nil }

	refund := client.Op{ID: "wf-8472:refund", Tool: "payments.refund", Params: p, Compensates: "wf-8472:charge"}
	res, err := c.Do(ctx, refund, fn)
	var ce *client.Error
	if errors.Is(err, client.ErrNotCompensable) && errors.As(err, &ce) {
		log.Println("nothing to reverse:", ce.Metadata["cause"]) // not_succeeded (reconcile the charge first), not_found, expired, limit
	}
	_ = res
}
