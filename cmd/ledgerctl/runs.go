package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/opledger/ledger/client"
)

// maxRunPageSize is the most ListRuns returns in one page
// (ledger.MaxRunPageSize; a test lowers it to read runs in several pages).
var maxRunPageSize = 500

// runStates maps the command line's names of run states to the SDK's.
var runStates = map[string]client.RunState{
	"running":    client.RunRunning,
	"done":       client.RunDone,
	"step-limit": client.RunStepLimit,
	"deadline":   client.RunDeadline,
	"repetition": client.RunRepetition,
	"cancelled":  client.RunCancelled,
	"canceled":   client.RunCancelled,
}

// parseRunState reads a run state as --state and end-run take it: a name
// of runStates in any case, with _ for -, or the wire name (RUN_STATE_DONE).
func parseRunState(s string) (client.RunState, bool) {
	name := strings.ReplaceAll(strings.TrimPrefix(strings.ToLower(s), "run_state_"), "_", "-")
	st, ok := runStates[name]
	return st, ok
}

// checkListRuns checks list-runs' flags and reads its --state.
func checkListRuns(o *options) error {
	if err := checkListing(o); err != nil {
		return err
	}
	var err error
	if o.runStates, err = parseStates(o.states, parseRunState, "running, done, step-limit, deadline, repetition or cancelled"); err != nil {
		return usagef(o.cmd, "%v", err)
	}
	return nil
}

// checkEndRun returns the state end-run asks for.
func checkEndRun(o *options) (client.RunState, error) {
	if len(o.args) != 2 || o.args[0] == "" {
		return 0, usagef(o.cmd, "end-run needs a run id and how it ended (done or cancelled)")
	}
	st, ok := parseRunState(o.args[1])
	if !ok || (st != client.RunDone && st != client.RunCancelled) {
		return 0, usagef(o.cmd, "unknown end %q: want done or cancelled", o.args[1])
	}
	return st, nil
}

// getRun prints one run.
func getRun(ctx context.Context, c *client.Client, o *options, stdout, _ io.Writer) error {
	r, err := c.GetRun(ctx, o.args[0])
	if err != nil {
		return err
	}
	return printRun(stdout, o, r)
}

// endRun ends a run and prints it after.
func endRun(ctx context.Context, c *client.Client, o *options, st client.RunState, stdout io.Writer) error {
	r, err := c.EndRun(ctx, o.args[0], st, o.reason)
	if err != nil {
		return err
	}
	return printRun(stdout, o, r)
}

// listRuns pages through the tenant's runs, running ones first, and prints
// at most --limit of them.
func listRuns(ctx context.Context, c *client.Client, o *options, stdout, stderr io.Writer) error {
	var runs []*client.Run
	truncated := false
	token := ""
	for {
		size := uint32(min(o.limit-len(runs)+1, maxRunPageSize)) // one more tells whether more remain
		p, err := c.ListRuns(ctx, size, token, o.runStates...)
		if err != nil {
			return err
		}
		for _, r := range p.Runs {
			if len(runs) == o.limit {
				truncated = true
				break
			}
			runs = append(runs, r)
		}
		if truncated || p.NextPageToken == "" {
			break
		}
		if p.NextPageToken == token {
			return &localError{reason: "BAD_PAGE", msg: "the ledger returned the same page token twice"}
		}
		token = p.NextPageToken
	}
	var notes notices
	more := func() {
		if truncated {
			notes.add(o, stderr, noticeMoreRemain, "showing the first %d; more remain (raise --limit)", len(runs))
		}
	}
	if o.json {
		more()
		l := jsonRunList{Runs: []jsonRun{}, Count: len(runs), Truncated: truncated, Notices: append([]jsonNotice{}, notes...)}
		for _, r := range runs {
			l.Runs = append(l.Runs, toJSONRun(r))
		}
		return writeJSON(stdout, l)
	}
	if len(runs) == 0 {
		fmt.Fprintln(stderr, "ledgerctl: no runs")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tSTEPS\tOPEN\tSTARTED\tDEADLINE\tENDED")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", clean(r.ID), runStateName(r.State), ofLimit(r.Steps, r.Limits.MaxSteps),
			r.OpenOperations, shortOrDash(r.StartedAt), shortOrDash(r.DeadlineAt), shortOrDash(r.EndedAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more()
	return nil
}

// jsonRun is a run with --json: the ledger's fields under their proto
// names, times as jsonTime prints them.
type jsonRun struct {
	RunID             string        `json:"run_id"`
	State             string        `json:"state"`
	Limits            jsonRunLimits `json:"limits"`
	Steps             uint32        `json:"steps"`
	IrreversibleSteps uint32        `json:"irreversible_steps"`
	MostRepeats       uint32        `json:"most_repeats"`
	OpenOperations    uint32        `json:"open_operations"`
	StartedAt         *string       `json:"started_at"`
	DeadlineAt        *string       `json:"deadline_at"`
	EndedAt           *string       `json:"ended_at"`
	EndReason         string        `json:"end_reason"`
	Implicit          bool          `json:"implicit"`
	StartedBy         string        `json:"started_by"`
}

// jsonRunLimits are a run's limits; deadline as protojson prints a
// duration ("600s", "" for none).
type jsonRunLimits struct {
	MaxSteps        uint32 `json:"max_steps"`
	Deadline        string `json:"deadline"`
	MaxRepeats      uint32 `json:"max_repeats"`
	MaxIrreversible uint32 `json:"max_irreversible"`
}

// jsonRunDocument is what get-run and end-run print with --json.
type jsonRunDocument struct {
	jsonRun
	Notices []jsonNotice `json:"notices"`
}

// jsonRunList is what list-runs prints with --json.
type jsonRunList struct {
	Runs      []jsonRun    `json:"runs"`
	Count     int          `json:"count"`
	Truncated bool         `json:"truncated"`
	Notices   []jsonNotice `json:"notices"`
}

func toJSONRun(r *client.Run) jsonRun {
	deadline := ""
	if r.Limits.Deadline != 0 {
		deadline = strconv.FormatFloat(r.Limits.Deadline.Seconds(), 'f', -1, 64) + "s"
	}
	return jsonRun{
		RunID: r.ID, State: r.State.String(),
		Limits: jsonRunLimits{MaxSteps: r.Limits.MaxSteps, Deadline: deadline, MaxRepeats: r.Limits.MaxRepeats,
			MaxIrreversible: r.Limits.MaxIrreversible},
		Steps: r.Steps, IrreversibleSteps: r.IrreversibleSteps, MostRepeats: r.MostRepeats, OpenOperations: r.OpenOperations,
		StartedAt: jsonTime(r.StartedAt), DeadlineAt: jsonTime(r.DeadlineAt), EndedAt: jsonTime(r.EndedAt),
		EndReason: r.EndReason, Implicit: r.Implicit, StartedBy: r.StartedBy,
	}
}

// printRun prints a run: JSON, or a readable block.
func printRun(w io.Writer, o *options, r *client.Run) error {
	if o.json {
		return writeJSON(w, jsonRunDocument{jsonRun: toJSONRun(r), Notices: []jsonNotice{}})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("run", clean(r.ID))
	row("state", runStateName(r.State))
	row("end reason", orDash(clean(r.EndReason)))
	row("started by", orDash(clean(r.StartedBy)))
	row("implicit", yesNo(r.Implicit))
	row("steps", ofLimit(r.Steps, r.Limits.MaxSteps))
	row("irreversible steps", ofLimit(r.IrreversibleSteps, r.Limits.MaxIrreversible))
	row("most repeats", ofLimit(r.MostRepeats, r.Limits.MaxRepeats))
	row("open operations", strconv.FormatUint(uint64(r.OpenOperations), 10))
	row("started", stampOrDash(r.StartedAt))
	deadline := stampOrDash(r.DeadlineAt)
	if r.Limits.Deadline != 0 {
		deadline += " (" + span(r.Limits.Deadline) + " after the start)"
	}
	row("deadline", deadline)
	row("ended", stampOrDash(r.EndedAt))
	return tw.Flush()
}

// runStateName is a run state without its prefix: RUNNING, DONE, ...
func runStateName(s client.RunState) string { return strings.TrimPrefix(s.String(), "RUN_STATE_") }

// ofLimit is "n of limit", or n alone without a limit.
func ofLimit(n, limit uint32) string {
	if limit == 0 {
		return strconv.FormatUint(uint64(n), 10)
	}
	return fmt.Sprintf("%d of %d", n, limit)
}

func stampOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return stamp(t)
}

func shortOrDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return shortStamp(t)
}
