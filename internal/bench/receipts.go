package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"

	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/receipt"
)

// Receipts is what receipts cost: the Reserve+Complete cycle on a ledgerd
// that signs none and on one that signs every Complete (fresh stacks, the
// same load, rounds alternating), the store memory per SUCCEEDED record on
// each, and the size of a Complete's answer with and without a receipt.
type Receipts struct {
	Unsigned, Signed *Summary
	MemUnsigned      *Memory
	MemSigned        *Memory
	AnswerBytes      [2]int // a Complete's answer: unsigned, signed
	ReceiptBytes     int
	Records          int64
	LedgerdCPURatio  float64 // ledgerd CPU per signed cycle ÷ per unsigned one, median of the rounds
	ThroughputRatio  float64 // signed cycles per second ÷ unsigned ones, median of the rounds
}

// receiptsPart measures Receipts.
func (c *Config) receiptsPart(ctx context.Context) (*Receipts, error) {
	fmt.Fprintln(c.Log, "receipts:")
	keyFile := filepath.Join(c.Dir, "receipts.jwk")
	k, err := receipt.NewKey("bench")
	if err != nil {
		return nil, err
	}
	b, err := k.MarshalJWK()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(keyFile, b, 0o600); err != nil {
		return nil, err
	}
	var stacks [2]*stack
	for i, extra := range [][]string{nil, {"--receipt-keys", keyFile}} {
		stacks[i], err = c.startStack([]string{"receipts-off", "receipts-on"}[i], benchPolicy, extra...)
		if err != nil {
			return nil, err
		}
		defer stacks[i].stop()
	}
	saved := c.pids
	defer func() { c.pids = saved }()
	rep := &Receipts{Records: c.ReceiptRecords}
	var rounds [2][]*Result
	var cpuRatio, rpsRatio []float64
	for round := range c.Rounds {
		for i, s := range stacks {
			res, err := c.cycleOn(ctx, s, fmt.Sprintf("cycle (receipts %s)", []string{"off", "on"}[i]), "r"+strconv.Itoa(round))
			if err != nil {
				return nil, err
			}
			rounds[i] = append(rounds[i], res)
		}
		off, on := rounds[0][round], rounds[1][round]
		if off.CPU.Ledgerd > 0 && off.RPS() > 0 {
			cpuRatio = append(cpuRatio, float64(on.CPU.Ledgerd)/float64(off.CPU.Ledgerd))
			rpsRatio = append(rpsRatio, on.RPS()/off.RPS())
		}
	}
	sums := summarize([][]*Result{rounds[0], rounds[1]})
	rep.Unsigned, rep.Signed = sums[0], sums[1]
	rep.LedgerdCPURatio, rep.ThroughputRatio = median(cpuRatio), median(rpsRatio)
	for i, s := range stacks {
		if rep.AnswerBytes[i], rep.ReceiptBytes, err = answerSize(ctx, s, i == 1); err != nil {
			return nil, err
		}
		c.pids[0], c.pids[1] = s.pids()
		m, err := c.fill(ctx, s, c.ReceiptRecords, "rm")
		if err != nil {
			return nil, err
		}
		if i == 0 {
			rep.MemUnsigned = m
		} else {
			rep.MemSigned = m
		}
	}
	return rep, nil
}

// cycleOn runs one window of Reserve+Complete cycles on s.
func (c *Config) cycleOn(ctx context.Context, s *stack, name, prefix string) (*Result, error) {
	t, err := Dial(s.addr, c.Conns)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	c.pids[0], c.pids[1] = s.pids()
	spec := Spec{Name: name, Concurrency: c.Concurrency, Warmup: c.Warmup, Duration: c.Duration, RPCs: 2}
	return c.run(ctx, spec, t.Cycle(RunID()+prefix))
}

// answerSize completes one operation on s and returns the size of the
// Complete's answer and of its receipt (which must be there when signed).
func answerSize(ctx context.Context, s *stack, signed bool) (answer, jws int, err error) {
	t, err := Dial(s.addr, 1)
	if err != nil {
		return 0, 0, err
	}
	defer t.Close()
	id := OperationID(RunID()+"size", 1)
	res, err := t.reserve(ctx, id, 1, ledgerv1.Decision_DECISION_EXECUTE)
	if err != nil {
		return 0, 0, err
	}
	done, err := t.ledger[0].Complete(ctx, &ledgerv1.CompleteRequest{OperationId: id, FencingToken: res.GetOperation().GetFencingToken(),
		Outcome: ledgerv1.Outcome_OUTCOME_SUCCEEDED, Result: t.result})
	if err != nil {
		return 0, 0, err
	}
	if signed != (done.GetReceipt() != "") {
		return 0, 0, fmt.Errorf("receipts part: a Complete with receipts %v answered receipt %q", signed, done.GetReceipt())
	}
	return proto.Size(done), len(done.GetReceipt()), nil
}

func (c *Config) printReceipts(r *Receipts) {
	fmt.Fprintf(c.Out, "\nreceipts: Reserve+Complete cycles at %d concurrent calls on two fresh stacks, one with --receipt-keys (%v windows; medians of %d rounds, alternating):\n",
		c.Concurrency, c.Duration, c.Rounds)
	w := tabwriter.NewWriter(c.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "receipts\tcycles/s\tp50\tp99\tCPU µs/cycle: load\tledgerd\tredis\tComplete answer B\tbytes/record\t")
	for i, s := range []*Summary{r.Unsigned, r.Signed} {
		m := []*Memory{r.MemUnsigned, r.MemSigned}[i]
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t%.0f\t\n", []string{"off", "on"}[i], s.RPS, ms(s.P50), ms(s.P99),
			us(s.CPU.Client), us(s.CPU.Ledgerd), us(s.CPU.Redis), r.AnswerBytes[i], m.PerRecord)
	}
	_ = w.Flush()
	fmt.Fprintf(c.Out, "  signed ÷ unsigned, per round: ledgerd CPU per cycle %.2f, cycles/s %.2f; a receipt is %d bytes; memory per record measured over %d records each\n",
		r.LedgerdCPURatio, r.ThroughputRatio, r.ReceiptBytes, r.Records)
}
