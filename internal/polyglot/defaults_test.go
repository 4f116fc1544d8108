package polyglot

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/opledger/ledger/client"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/server"
)

// TestExamplesToolTimeoutDefault checks that the Node and Python examples
// give a tool, by default, as long to return as the Go SDK does
// (client.DefaultToolPolicy.Timeout), and that their READMEs say so.
func TestExamplesToolTimeoutDefault(t *testing.T) {
	t.Parallel()
	want := client.DefaultToolPolicy.Timeout
	for _, c := range []struct {
		file, pattern string
		unit          time.Duration
	}{
		{"clients/typescript/src/ledger.ts", `toolTimeoutMs = (\d+)\b`, time.Millisecond},
		{"examples/node/README.md", `\(([\d.]+)\s+s\s+if\s+not\s+given\)`, time.Second},
		{"examples/node/README.md", "`toolTimeoutMs`\\s+\\(([\\d.]+)\\s+s\\s+unless", time.Second},
		{"clients/python/src/opledger/client.py", `tool_timeout: float = ([\d.]+)`, time.Second},
		{"examples/python/README.md", `\(([\d.]+)\s+s\s+if\s+not\s+given\)`, time.Second},
		{"examples/python/README.md", "`tool_timeout`\\s+seconds\\s+\\(([\\d.]+)\\s+unless", time.Second},
	} {
		text, err := os.ReadFile(filepath.Join(repoRoot(t), c.file))
		if err != nil {
			t.Fatal(err)
		}
		found := regexp.MustCompile(c.pattern).FindAllStringSubmatch(string(text), -1)
		if len(found) == 0 {
			t.Errorf("%s: no default tool timeout matching %q", c.file, c.pattern)
		}
		for _, m := range found {
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", c.file, m[0], err)
			}
			if got := time.Duration(v * float64(c.unit)); got != want {
				t.Errorf("%s: %q is a default tool timeout of %s; the Go SDK's is %s", c.file, m[0], got, want)
			}
		}
	}
}

// exampleConstant returns the string values of the constant that pattern
// finds in file (its first group: a literal, or a list of literals), in
// order.
func exampleConstant(t *testing.T, file, pattern string) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(repoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(pattern).FindStringSubmatch(string(text))
	if m == nil {
		t.Fatalf("%s: nothing matches %q", file, pattern)
	}
	var values []string
	for _, q := range regexp.MustCompile(`'([^']*)'|"([^"]*)"`).FindAllStringSubmatch(m[1], -1) {
		values = append(values, q[1]+q[2])
	}
	return values
}

// dialGoSDK returns a Go SDK client of the ledgerd at addr; interceptor, if
// not nil, sees every call it makes.
func dialGoSDK(t *testing.T, addr string, interceptor grpc.UnaryClientInterceptor) *client.Client {
	t.Helper()
	var opts []client.Option
	if interceptor != nil {
		opts = append(opts, client.WithDialOptions(grpc.WithUnaryInterceptor(interceptor)))
	}
	c, err := client.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestExamplesDefaultFailureCode checks that the Node and Python examples
// record a final failure without a code (or with one the ledger refuses)
// under the code the Go SDK records for it.
func TestExamplesDefaultFailureCode(t *testing.T) {
	t.Parallel()
	c := dialGoSDK(t, startLedgerd(t), nil)
	op := client.Op{ID: "defaults:no-code", Tool: "tickets.create", Params: map[string]any{"title": "x"}, PermitID: "approval-77"}
	ran := 0
	_, err := c.Do(context.Background(), op, func(context.Context, client.Attempt) (client.Result, error) {
		ran++
		return client.Result{}, client.MarkFinal("", errors.New("declined"))
	})
	var failed *client.FailedError
	if !errors.As(err, &failed) || ran != 1 {
		t.Fatalf("Go SDK, a final failure without a code: ran %d time(s), got %v; want one run and a *FailedError", ran, err)
	}
	want := failed.Code
	if want == "" {
		t.Fatal("the Go SDK recorded an empty failure code")
	}
	for _, c := range []struct{ file, pattern string }{
		{"clients/typescript/src/ledger.ts", `const DEFAULT_FAILURE_CODE = ('[^']*');`},
		{"clients/python/src/opledger/client.py", `\nDEFAULT_FAILURE_CODE = ("[^"]*")`},
	} {
		if got := exampleConstant(t, c.file, c.pattern); len(got) != 1 || got[0] != want {
			t.Errorf("%s: DEFAULT_FAILURE_CODE is %q; the Go SDK records %q", c.file, got, want)
		}
	}
}

// TestExamplesRetryableFailureCode checks that the Node and Python examples
// record a retryable failure (one their tool proved not applied, or a claim
// whose lease ended on the way) under the failure code the Go SDK records
// for it.
func TestExamplesRetryableFailureCode(t *testing.T) {
	t.Parallel()
	// No retry: the failed attempt's record is the last one, and is read back.
	c, err := client.Dial(startLedgerd(t), client.WithToolPolicy("tickets.create", client.ToolPolicy{Timeout: 10 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	op := client.Op{ID: "defaults:retryable", Tool: "tickets.create", Params: map[string]any{"title": "x"}, PermitID: "approval-77"}
	ran := 0
	_, err = c.Do(context.Background(), op, func(context.Context, client.Attempt) (client.Result, error) {
		ran++
		return client.Result{}, client.MarkRetryable(errors.New("429"))
	})
	var exhausted *client.ExhaustedError
	if !errors.As(err, &exhausted) || ran != 1 {
		t.Fatalf("Go SDK, a retryable failure and no retries: ran %d time(s), got %v; want one run and an *ExhaustedError", ran, err)
	}
	record, err := c.Lookup(context.Background(), op.ID)
	if err != nil {
		t.Fatal(err)
	}
	if record.State != client.StatePending || record.Failure == nil || record.Failure.Code == "" {
		t.Fatalf("the Go SDK's retryable failure left the record %s with failure %+v; want PENDING with a failure code", record.State, record.Failure)
	}
	want := record.Failure.Code
	for _, c := range []struct{ file, pattern string }{
		{"clients/typescript/src/ledger.ts", `const RETRYABLE_FAILURE_CODE = ('[^']*');`},
		{"clients/python/src/opledger/client.py", `\nRETRYABLE_FAILURE_CODE = ("[^"]*")`},
	} {
		if got := exampleConstant(t, c.file, c.pattern); len(got) != 1 || got[0] != want {
			t.Errorf("%s: RETRYABLE_FAILURE_CODE is %q; the Go SDK records %q", c.file, got, want)
		}
	}
}

// TestExamplesBackOffReasons checks that the Node and Python examples repeat
// a RESOURCE_EXHAUSTED Reserve for the same ledger reasons as the Go SDK
// (RATE_LIMITED, not UNRESOLVED_LIMIT). Each reason is injected into the Go
// SDK's first Reserve, as the examples' faults scenarios inject it, and the
// Reserves that go out are counted.
func TestExamplesBackOffReasons(t *testing.T) {
	t.Parallel()
	addr := startLedgerd(t)
	var want []string
	for _, reason := range []string{server.ReasonRateLimited, server.ReasonUnresolvedLimit} {
		reserves := 0
		inject := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method != ledgerv1.LedgerService_Reserve_FullMethodName {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			reserves++
			if reserves > 1 {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			st, err := status.New(codes.ResourceExhausted, "injected").WithDetails(
				&errdetails.ErrorInfo{Reason: reason, Domain: server.ErrorDomain},
				&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Millisecond)})
			if err != nil {
				return err
			}
			return st.Err()
		}
		c := dialGoSDK(t, addr, inject)
		op := client.Op{ID: "defaults:" + reason, Tool: "tickets.create", Params: map[string]any{"title": "x"}, PermitID: "approval-77"}
		_, err := c.Do(context.Background(), op, func(context.Context, client.Attempt) (client.Result, error) {
			return client.Result{ResourceID: "TCK-1"}, nil
		})
		switch {
		case reserves > 1 && err == nil:
			want = append(want, reason) // repeated, then granted
		case reserves == 1 && err != nil:
			// returned at once
		default:
			t.Fatalf("Go SDK, a Reserve refused once with %s: %d Reserve(s), error %v", reason, reserves, err)
		}
	}
	if !slices.Equal(want, []string{server.ReasonRateLimited}) {
		t.Fatalf("the Go SDK repeats a Reserve refused with %q; this test expects RATE_LIMITED only", want)
	}
	for _, c := range []struct{ file, pattern string }{
		{"clients/typescript/src/ledger.ts", `const BACK_OFF_REASONS = new Set\(\[([^\]]*)\]\);`},
		{"clients/python/src/opledger/client.py", `\n_BACK_OFF_REASONS = \(([^)]*)\)`},
	} {
		got := exampleConstant(t, c.file, c.pattern)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: repeats RESOURCE_EXHAUSTED with the reasons %q; the Go SDK with %q", c.file, got, want)
		}
	}
}

// TestExamplesLeaseMargin checks that the Node and Python examples stop a
// tool whose renewals do not get through as long before its lease's end as
// the Go SDK does (client.LeaseMargin: a tenth of the lease, at most 1s):
// each example's own function computes the margin of a few leases.
func TestExamplesLeaseMargin(t *testing.T) {
	t.Parallel()
	leases := []time.Duration{30 * time.Millisecond, 2 * time.Second, 4 * time.Second, 9999 * time.Millisecond,
		10 * time.Second, 15 * time.Second, time.Hour}
	var ms []string
	for _, l := range leases {
		ms = append(ms, strconv.FormatInt(l.Milliseconds(), 10))
	}
	list := strings.Join(ms, ",")
	for _, c := range []struct {
		name string
		unit time.Duration
		cmd  func() *exec.Cmd
	}{
		{"clients/python/src/opledger/client.py lease_margin", time.Second, func() *exec.Cmd {
			probe := exec.Command(systemPython, "-s", "-c", "import grpc, google.protobuf")
			probe.Env = cleanEnv()
			need(t, probe.Run() == nil, "%s cannot import grpc and google.protobuf (Debian: python3-grpcio, python3-protobuf)", systemPython)
			return exec.Command(systemPython, "-s", "-c", fmt.Sprintf(
				"import sys; sys.dont_write_bytecode = True; sys.path.insert(0, 'clients/python/src'); import opledger.client\n"+
					"for ms in [%s]: print(repr(opledger.client.lease_margin(ms / 1000)))", list))
		}},
		{"clients/typescript leaseMarginMs", time.Millisecond, func() *exec.Cmd {
			node, err := exec.LookPath("node")
			need(t, err == nil, "node is not on PATH")
			_, err = os.Stat(filepath.Join(repoRoot(t), "examples", "node", "node_modules", "@grpc", "grpc-js"))
			need(t, err == nil, "examples/node/node_modules is not installed (npm ci --prefix examples/node)")
			buildTypeScript(t)
			return exec.Command(node, "-e", fmt.Sprintf(
				"const { leaseMarginMs } = require('./clients/typescript/dist'); "+
					"for (const ms of [%s]) console.log(String(leaseMarginMs(ms)));", list))
		}},
	} {
		cmd := c.cmd()
		cmd.Dir = repoRoot(t)
		cmd.Env = cleanEnv("PYTHONDONTWRITEBYTECODE=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.name, err, out)
		}
		got := strings.Fields(string(out))
		if len(got) != len(leases) {
			t.Fatalf("%s: %d margins for %d leases:\n%s", c.name, len(got), len(leases), out)
		}
		for i, lease := range leases {
			v, err := strconv.ParseFloat(got[i], 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", c.name, got[i], err)
			}
			// To the microsecond: the examples compute in floating point.
			margin := time.Duration(math.Round(v*float64(c.unit)/float64(time.Microsecond))) * time.Microsecond
			if want := client.LeaseMargin(lease); margin != want {
				t.Errorf("%s: a lease of %s has a margin of %s; the Go SDK's is %s", c.name, lease, margin, want)
			}
		}
	}
}
