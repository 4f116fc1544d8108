package agent_test

import (
	"context"
	"errors"
	"log"
	"log/slog"
	"time"

	"github.com/opledger/ledger/client"
	"github.com/opledger/ledger/client/agent"
)

// The examples hold the Go snippets of docs/agent.md and of
// examples/appointment/README.md: each snippet is in an example's body as
// the page shows it (client's TestDocsGoSnippetsAreExamples), so go vet
// and go test compile it. They have no output: they need a ledger to talk
// to. What the snippets leave to the reader (a model, a clinic's API, a
// store for transcripts) is declared here.

// appointment is what the clinic's API answers.
type appointment struct{ ID, Start string }

// clinicAPI is a destination's client, as the snippets use it.
type clinicAPI struct{}

// Create would book an appointment under the caller's reference.
func (clinicAPI) Create(ctx context.Context, reference string, args map[string]any) (appointment, error) {
	return appointment{}, errors.New("no clinic in an example")
}

// FindByReference would ask the clinic for the appointment booked under
// reference.
func (clinicAPI) FindByReference(ctx context.Context, reference string) (appointment, bool) {
	return appointment{}, false
}

var clinic clinicAPI

// transcripts is where a runtime saves its runs.
type transcripts struct{}

// Save would store a run's transcript.
func (transcripts) Save(ctx context.Context, runID string, t []agent.Message) error { return nil }

var db transcripts

// Example is the loop of docs/agent.md.
func Example() {
	ctx := context.Background()
	var c *client.Client
	model := agent.ModelFunc(func(ctx context.Context, transcript []agent.Message) (agent.Turn, error) {
		return agent.Turn{Text: "done"}, nil
	})
	var tools []agent.Tool
	save := func(ctx context.Context, runID string, transcript []agent.Message) error { return nil }
	request := []agent.Message{{Role: agent.RoleUser, Text: "book me in on Monday"}}

	r, err := agent.New(agent.Config{
		Client:       c,               // *client.Client; required when a tool is mutating
		Model:        model,           // agent.Model: Next(ctx, transcript) (Turn, error)
		Tools:        tools,           // []agent.Tool
		MaxSteps:     20,              // model turns (default 20)
		Deadline:     5 * time.Minute, // wall clock per Run (default 5m)
		ModelTimeout: time.Minute,     // per model call (default 2m)
		RepeatLimit:  3,               // same tool + same canonical args (default 3)
		Logger:       slog.Default(),
		Checkpoint:   save, // optional: save the transcript after every message
	})
	if err != nil {
		log.Fatal(err) // a Config it refuses: a mutating tool without a Client, a duplicate name
	}
	out := r.Run(ctx, agent.Input{RunID: "run-8472", PermitID: "approval-77", Transcript: request})
	_ = out
}

// Example_appointment is "How a Go runtime wires the ledger into a tool
// call" of examples/appointment/README.md.
func Example_appointment() {
	ctx := context.Background()
	var model agent.Model
	var saved []agent.Message
	approvalID := "approval-77"

	c, err := client.Dial("127.0.0.1:50051") // ledgerd; TLS via client.WithDialOptions
	if err != nil {
		log.Fatal(err)
	}

	createAppointment := agent.Tool{
		Name: "create_appointment", Mutating: true,
		Policy: client.ToolPolicy{Timeout: 2 * time.Second, MaxRetries: 1, Effect: client.EffectIrreversible},
		Func: func(ctx context.Context, call agent.Call) (client.Result, error) {
			// One attempt. Send call.Attempt.OperationID as the clinic's reference
			// (and call.Attempt.IdempotencyKey to APIs that honour one).
			a, err := clinic.Create(ctx, call.Attempt.OperationID, call.Args)
			if err != nil {
				return client.Result{}, err // classified: client.ClassOf / MarkRetryable / MarkFinal
			}
			return client.Result{ResourceID: a.ID, Data: map[string]any{"start": a.Start}}, nil
		},
		Reconciler: func(ctx context.Context, op *client.Operation) (client.Finding, error) {
			if a, ok := clinic.FindByReference(ctx, op.ID); ok {
				return client.Finding{Kind: client.Applied, Result: client.Result{ResourceID: a.ID}}, nil
			}
			return client.Finding{Kind: client.NotApplied}, nil
		},
	}

	r, err := agent.New(agent.Config{
		Client: c, Model: model, Tools: []agent.Tool{createAppointment},
		Checkpoint: func(ctx context.Context, runID string, t []agent.Message) error { return db.Save(ctx, runID, t) },
	})
	if err != nil {
		log.Fatal(err) // a Config it refuses: a mutating tool without a Client, a duplicate name
	}
	out := r.Run(ctx, agent.Input{RunID: "visit-42", PermitID: approvalID, Transcript: saved})
	switch out.Status { // "done", "step_limit", "deadline", "repetition" or "error"
	}
}
