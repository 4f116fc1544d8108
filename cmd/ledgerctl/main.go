// Command ledgerctl is the operator's command line for the operation ledger
// (ledger.v1.LedgerService): it finds the operations nobody has resolved and
// settles them from what the destination system says, and reads and ends
// agent runs.
//
//	ledgerctl lookup <operation_id>
//	ledgerctl list-unresolved [--state S] [--tool T] [--overdue] [--needs-review] [--limit N]
//	ledgerctl reconcile <operation_id> applied|not-applied|abandon|escalate [flags]
//	ledgerctl get-run <run_id>
//	ledgerctl list-runs [--limit N]
//	ledgerctl end-run <run_id> done|cancelled [--reason TEXT]
//	ledgerctl verify-receipt FILE --jwks FILE
//	ledgerctl verify-history FILE [--receipt FILE]... [--jwks FILE]
//	ledgerctl jwks KEYFILE...
//
// Global flags (--addr, --api-key, --tls, --tls-ca, --tls-cert, --tls-key,
// --timeout, --json) go before or after the command; a command's own flags
// go after the command name, before or after its arguments. The last three
// commands read files only, never the ledger: they come first and take no
// global flags. "ledgerctl help" prints the whole usage; docs/ledgerctl.md
// is the operator's guide.
//
// Exit status: 0 on success, 1 when the call failed (the ledger refused it
// or could not be reached, or ledgerctl could not make it: a TLS file it
// cannot read, an address it cannot parse, an API key it will not send in
// clear), 2 on bad usage.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/resolver"

	"github.com/opledger/ledger/client"
)

// clock is this machine's clock (a test sets it behind the store's).
var clock = time.Now

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Defaults.
const (
	defaultAddr    = "127.0.0.1:50051"
	defaultTimeout = 10 * time.Second
	defaultLimit   = 1000
)

// maxPageSize is the most ListUnresolved returns in one page (a test lowers
// it to read a listing in several pages).
var maxPageSize = 1000

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

const usageHead = `usage: ledgerctl [global flags] <command> [arguments] [flags]

Operate the operation ledger: find the operations nobody has resolved and
settle them from what the destination system says; read and end agent runs.

commands:
  lookup <operation_id>
        show an operation: state, attempt, result or failure, times, history
  list-unresolved [--state S] [--tool T] [--overdue] [--needs-review] [--limit N]
        the operations that are not resolved (PENDING, UNKNOWN, RUNNING past
        its lease), oldest first
  reconcile <operation_id> applied|not-applied|abandon|escalate [flags]
        record what the destination says about the operation
  get-run <run_id>
        show an agent run: state, steps against its limits, times
  list-runs [--state S] [--limit N]
        the agent runs, running ones first
  end-run <run_id> done|cancelled [--reason TEXT]
        end an agent run: the ledger admits no new step of it
  verify-receipt FILE --jwks FILE
        verify a receipt offline and print what it signs (no connection)
  verify-history FILE [--receipt FILE]... [--jwks FILE]
        check a saved lookup's history chain and receipts (no connection)
  jwks KEYFILE...
        print the JWK Set of receipt key files (no connection)
  help [command]
        this text, or one command's
`

const usageGlobal = `
global flags (before or after the command):
  --addr HOST:PORT      the ledger (env LEDGER_ADDR; default 127.0.0.1:50051), or
                        a gRPC target: dns:///HOST:PORT, unix:PATH, unix-abstract:NAME
  --api-key KEY         API key "<id>.<secret>" (env LEDGER_API_KEY, preferred:
                        a flag shows in ps and in the shell's history)
  --tls                 connect with TLS (implied by --tls-ca and --tls-cert;
                        --tls=false with a TLS file is bad usage)
  --tls-ca FILE         CA of the ledger's certificate, PEM (env LEDGER_TLS_CA;
                        default: the system's roots)
  --tls-cert FILE       client certificate, PEM, for mTLS (with --tls-key)
  --tls-key FILE        the client certificate's private key, PEM
  --timeout DURATION    give up after this long (default 10s)
  --json                print one JSON document on stdout, with the notices
                        in it ("notices"), and errors as JSON on stderr

exit status: 0 success; 1 the call failed: the ledger refused it or could
not be reached, or ledgerctl could not make it (TLS_CONFIG: a TLS file it
cannot read, BAD_ADDRESS: an --addr it cannot parse, API_KEY_NOT_SENT: a key
it will not send without TLS); 2 bad usage.
`

var commandUsage = map[string]string{
	"lookup": `
lookup <operation_id>
  Prints the record of the operation in the tenant of your credentials, with
  its history (the latest 50 transitions; a line says when earlier ones were
  not kept). Any scope may look up.
`,
	"list-unresolved": `
list-unresolved [flags]
  Lists the operations that are not resolved, oldest first: PENDING, UNKNOWN
  (escalated ones included) and RUNNING past its lease. Needs the reconciler
  or viewer scope.
  --state S             pending, running or unknown; repeat the flag or
                        separate states with commas (default: all three)
  --tool NAME           only operations of this tool
  --overdue             only UNKNOWN operations past their recovery deadline
  --needs-review        only operations escalated to a human
  --limit N             print at most N operations (default 1000)
`,
	"reconcile": `
reconcile <operation_id> <finding> [flags]
  Records what the destination system says about an UNKNOWN operation (or a
  PENDING one, or a RUNNING one past its lease), and prints the record after
  it. Ask the destination first, by operation id. Needs the reconciler scope.
  Repeating the same finding (with the same result or failure) is harmless.
  findings:
    applied             the effect exists: SUCCEEDED, with the result
    not-applied         the effect does not exist: PENDING, the next Reserve
                        runs it again
    abandon             give up for good: FAILED_FINAL
    escalate            a human must decide: stays UNKNOWN, needs_review
  --resource-id ID      with applied: what the effect created (a refund id...)
  --data JSON           with applied: the result data, a JSON object (each
                        key once; numbers a 64-bit float holds as written)
  --failure-code CODE   with abandon: the recorded failure code (default
                        ABANDONED)
  --failure-message T   with abandon: the recorded failure message
  --note TEXT           kept in the history, with any finding (at most 256
                        bytes; never parameters or secrets)
  --fencing-token N     the fencing token lookup showed (decimal): the finding
                        is about that attempt, and is refused
                        (STALE_FENCING_TOKEN) if another attempt holds the
                        operation by then
`,
	"get-run": `
get-run <run_id>
  Prints the agent run in the tenant of your credentials: its state, steps
  against its limits, open operations, start, deadline and end. Needs the
  agent, reconciler or viewer scope.
`,
	"list-runs": `
list-runs [flags]
  Lists the tenant's agent runs, running ones first. Needs the reconciler
  or viewer scope.
  --state S             running, done, step-limit, deadline, repetition or
                        cancelled; repeat the flag or separate states with
                        commas (default: all)
  --limit N             print at most N runs (default 1000)
`,
	"end-run": `
end-run <run_id> done|cancelled [flags]
  Ends a running agent run, and prints it after: the ledger admits no new
  step of it (a Reserve of a new operation is refused with RUN_ENDED), while
  its operations already admitted may still complete. Ending it the same
  way again is harmless; a run that ended otherwise is refused (RUN_ENDED).
  Needs the agent or reconciler scope.
  --reason TEXT         kept with the run (at most 256 bytes; never
                        parameters or secrets)
`,
}

var commands = []string{"lookup", "list-unresolved", "reconcile", "get-run", "list-runs", "end-run"}

// usage returns the usage text of cmd, or the whole usage for "".
func usage(cmd string) string {
	if c, ok := offlineCommands[cmd]; ok {
		return c.usage
	}
	if u, ok := commandUsage[cmd]; ok {
		return "usage: ledgerctl [global flags] " + strings.TrimPrefix(u, "\n") + usageGlobal
	}
	var b strings.Builder
	b.WriteString(usageHead)
	for _, c := range commands {
		b.WriteString(commandUsage[c])
	}
	b.WriteString(usageGlobal)
	return b.String()
}

// options are the parsed command line.
type options struct {
	cmd  string
	args []string

	addr, apiKey            string
	addrFrom                string // "--addr", or "LEDGER_ADDR" when the address is the environment's
	tls                     bool
	tlsCA, tlsCert, tlsKey  string
	timeout                 time.Duration
	json                    bool
	states                  stateList // --state as given: operation states or run states, by command
	opStates                []client.State
	runStates               []client.RunState
	tool                    string
	overdue, needsReview    bool
	limit                   int
	resourceID, data        string
	failureCode, failureMsg string
	note, reason            string
	fencingToken            uint64
	failureSet, resourceSet bool
}

// globalFlags are accepted with every command; the others belong to one.
var globalFlags = []string{"addr", "api-key", "tls", "tls-ca", "tls-cert", "tls-key", "timeout", "json"}

var commandFlags = map[string][]string{
	"lookup":          nil,
	"list-unresolved": {"state", "tool", "overdue", "needs-review", "limit"},
	"reconcile":       {"resource-id", "data", "failure-code", "failure-message", "note", "fencing-token"},
	"get-run":         nil,
	"list-runs":       {"state", "limit"},
	"end-run":         {"reason"},
}

// secret is a flag value that never shows itself (in usage or errors).
type secret struct{ p *string }

func (s secret) String() string { return "" }
func (s secret) Set(v string) error {
	*s.p = strings.TrimSpace(v)
	return nil
}

// fencingToken is --fencing-token: the decimal number lookup shows, never
// 0 (which would make the finding about whichever attempt is current). Not
// strconv's base prefixes (0x, 0, _): a token must read as lookup printed it.
type fencingToken struct{ p *uint64 }

func (t fencingToken) String() string { return "" }
func (t fencingToken) Set(v string) error {
	if v == "" || strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return errors.New("not a decimal number (the fencing token lookup shows)")
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return errors.New("out of range (the fencing token lookup shows)")
	}
	if n == 0 || v[0] == '0' {
		return errors.New("no attempt has the fencing token " + v + " (the fencing token lookup shows)")
	}
	*t.p = n
	return nil
}

// stateList collects --state values, split at commas; the command reads
// them as operation states (list-unresolved) or run states (list-runs).
type stateList []string

func (l *stateList) String() string { return "" }
func (l *stateList) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		*l = append(*l, strings.TrimSpace(part))
	}
	return nil
}

// parseStates reads every state of l with parse, each once; what names
// the states parse takes, for the error.
func parseStates[S comparable](l stateList, parse func(string) (S, bool), what string) ([]S, error) {
	var out []S
	for _, part := range l {
		s, ok := parse(part)
		if !ok {
			return nil, fmt.Errorf("--state: %q is not %s", part, what)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func parseState(s string) (client.State, bool) {
	switch strings.TrimPrefix(strings.ToLower(s), "state_") {
	case "pending":
		return client.StatePending, true
	case "running":
		return client.StateRunning, true
	case "unknown":
		return client.StateUnknown, true
	}
	return 0, false
}

// usageError is a bad command line: exit 2 with the usage of cmd.
type usageError struct {
	cmd string
	msg string
}

func (e *usageError) Error() string { return e.msg }

func usagef(cmd, format string, a ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, a...)}
}

// errHelp asks for the usage of a command ("" for all) on stdout.
type errHelp struct{ cmd string }

func (e errHelp) Error() string { return "help requested" }

// parse reads the command line. Flags may come anywhere; "--" ends them.
// The options are returned with an error too, as far as they were read.
func parse(args []string, env func(string) string) (*options, error) {
	o := newOptions(env)
	fs := newFlagSet(o)
	// Know the key before parsing, to redact it from any parse error that
	// echoes a misplaced argument.
	o.apiKey = apiKeyArg(args, o.apiKey)
	if err := parseCommand(o, fs, args); err != nil {
		return o, err
	}
	if !isPrintableASCII(o.apiKey) {
		return o, usagef(o.cmd, "the API key (--api-key, or LEDGER_API_KEY) has bytes no API key has: keys are printable ASCII")
	}
	given, err := checkGiven(o, fs)
	if err != nil {
		return o, err
	}
	return o, checkConnection(o, given)
}

// apiKeyArg returns the value of --api-key in args, or key when it is not
// there.
func apiKeyArg(args []string, key string) string {
	for i, a := range args {
		if name, val, eq := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && name == "api-key" {
			if eq {
				key = strings.TrimSpace(val)
			} else if i+1 < len(args) {
				key = strings.TrimSpace(args[i+1])
			}
		}
	}
	return key
}

// parseCommand parses args' flags into fs and sets o's command and its
// arguments. It refuses an unknown command, a flag it cannot parse and an
// argument that is not UTF-8; it returns errHelp or help's answer for -h
// and help.
func parseCommand(o *options, fs *flag.FlagSet, args []string) error {
	flagArgs, positional := split(fs, args)
	cmd := ""
	if len(positional) > 0 {
		cmd = positional[0]
	}
	err := fs.Parse(flagArgs)
	if errors.Is(err, flag.ErrHelp) {
		if cmd == "help" {
			// -h adds nothing to help's own answer.
			return helpCommand(positional)
		}
		if cmd != "" && known(cmd) == "" {
			// Help about a command that does not exist is no answer.
			return usagef("", "unknown command %q", cmd)
		}
		return errHelp{cmd: known(cmd)}
	}
	if _, ok := offlineCommands[cmd]; ok {
		// run dispatches it when it comes first.
		return usagef(cmd, "%s reads files only and takes no global flags: give it first, \"ledgerctl %s ...\"", cmd, cmd)
	}
	if err != nil {
		return usagef(known(cmd), "%s", strings.Replace(err.Error(), " -", " --", 1))
	}
	if cmd == "" {
		return usagef("", "no command")
	}
	if cmd == "help" {
		return helpCommand(positional)
	}
	if _, ok := commandFlags[cmd]; !ok {
		return usagef("", "unknown command %q", cmd)
	}
	o.cmd, o.args = cmd, positional[1:]
	for _, a := range o.args {
		if !utf8.ValidString(a) {
			return usagef(cmd, "argument %q is not UTF-8 text", a)
		}
	}
	return nil
}

// checkGiven checks the flags given on the command line: each one of o's
// command, in UTF-8, and not empty where empty would mean something else
// than leaving it out. It returns the names of those given.
func checkGiven(o *options, fs *flag.FlagSet) (map[string]bool, error) {
	cmd := o.cmd
	var bad error
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		given[f.Name] = true
		if bad == nil && !slices.Contains(globalFlags, f.Name) && !slices.Contains(commandFlags[cmd], f.Name) {
			bad = usagef(cmd, "--%s is not a flag of %s", f.Name, cmd)
		}
		if bad == nil && f.Name != "data" && !utf8.ValidString(f.Value.String()) {
			// (parseData says where in --data.)
			bad = usagef(cmd, "--%s is not UTF-8 text", f.Name)
		}
		// An empty value is an unset variable, not the flag left out.
		empty := bad == nil && f.Value.String() == ""
		switch f.Name {
		case "api-key":
			// No key at all, in place of LEDGER_API_KEY's. (Its String
			// never shows the key: look at the key itself.)
			if bad == nil && o.apiKey == "" {
				bad = usagef(cmd, "--api-key is empty (leave the flag out for LEDGER_API_KEY's)")
			}
		case "tls-ca", "tls-cert", "tls-key":
			// Without the file the connection would be plaintext (or
			// without the client certificate).
			if empty {
				bad = usagef(cmd, "--%s is empty", f.Name)
			}
		case "tool", "note", "reason":
			// A list of every tool; a finding without its note; a run
			// ended without its reason.
			if empty {
				bad = usagef(cmd, "--%s is empty (leave the flag out for none)", f.Name)
			}
		case "failure-code", "failure-message":
			o.failureSet = true
			if empty {
				bad = usagef(cmd, "--%s is empty (leave the flag out for none)", f.Name)
			}
		case "resource-id", "data":
			// A result recorded without the id or data found, replayed
			// to every retry.
			o.resourceSet = true
			if empty {
				bad = usagef(cmd, "--%s is empty (leave the flag out for none)", f.Name)
			}
		}
	})
	return given, bad
}

// checkConnection checks the connection's settings: an address, a positive
// timeout, TLS files only with TLS, a client certificate with its key.
func checkConnection(o *options, given map[string]bool) error {
	cmd := o.cmd
	if given["addr"] {
		o.addrFrom = "--addr"
	}
	if given["tls"] && !o.tls {
		// A TLS file turns TLS on: with --tls=false it would do so behind
		// the operator's back.
		for _, name := range []string{"tls-ca", "tls-cert", "tls-key"} {
			if given[name] {
				return usagef(cmd, "--tls=false conflicts with --%s, which is for TLS: leave out one of them", name)
			}
		}
		if o.tlsCA != "" {
			return usagef(cmd, "--tls=false conflicts with LEDGER_TLS_CA (set in the environment), which is for TLS:"+
				" unset it for a plaintext connection, or leave out --tls=false")
		}
	}
	if o.addr == "" {
		return usagef(cmd, "--addr is empty")
	}
	if o.timeout <= 0 {
		return usagef(cmd, "--timeout must be positive")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return usagef(cmd, "--tls-cert and --tls-key go together")
	}
	return nil
}

// isPrintableASCII reports whether s has only the bytes a gRPC header
// value may carry.
func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// helpCommand answers the command line positional, "help [command]": the
// usage of the command (all of it without one), or bad usage.
func helpCommand(positional []string) error {
	switch {
	case len(positional) > 2:
		return usagef("", "help takes one command, not %d", len(positional)-1)
	case len(positional) == 1 || positional[1] == "help":
		return errHelp{}
	case known(positional[1]) == "":
		return usagef("", "unknown command %q: help takes one of %s", positional[1], strings.Join(allCommands(), ", "))
	}
	return errHelp{cmd: positional[1]}
}

// newOptions returns the options before the command line is read: the
// defaults, and the values of the environment (env is os.Getenv) in their
// place.
func newOptions(env func(string) string) *options {
	o := &options{addr: env("LEDGER_ADDR"), addrFrom: "LEDGER_ADDR", tlsCA: env("LEDGER_TLS_CA"), timeout: defaultTimeout, limit: defaultLimit}
	if o.addr == "" {
		o.addr, o.addrFrom = defaultAddr, "--addr"
	}
	o.apiKey = strings.TrimSpace(env("LEDGER_API_KEY"))
	return o
}

// newFlagSet defines every flag of ledgerctl (globalFlags and those of
// commandFlags) on a new flag set that fills o, with o's values as the
// defaults.
func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("ledgerctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&o.addr, "addr", o.addr, "")
	fs.Var(secret{&o.apiKey}, "api-key", "")
	fs.BoolVar(&o.tls, "tls", false, "")
	fs.StringVar(&o.tlsCA, "tls-ca", o.tlsCA, "")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "")
	fs.StringVar(&o.tlsKey, "tls-key", "", "")
	fs.DurationVar(&o.timeout, "timeout", o.timeout, "")
	fs.BoolVar(&o.json, "json", false, "")
	fs.Var(&o.states, "state", "")
	fs.StringVar(&o.tool, "tool", "", "")
	fs.BoolVar(&o.overdue, "overdue", false, "")
	fs.BoolVar(&o.needsReview, "needs-review", false, "")
	fs.IntVar(&o.limit, "limit", o.limit, "")
	fs.StringVar(&o.resourceID, "resource-id", "", "")
	fs.StringVar(&o.data, "data", "", "")
	fs.StringVar(&o.failureCode, "failure-code", "", "")
	fs.StringVar(&o.failureMsg, "failure-message", "", "")
	fs.StringVar(&o.note, "note", "", "")
	fs.StringVar(&o.reason, "reason", "", "")
	fs.Var(fencingToken{&o.fencingToken}, "fencing-token", "")
	return fs
}

// redact removes the API key (and its secret part) from text that echoes
// the command line.
func redact(text, key string) string {
	if key == "" {
		return text
	}
	text = strings.ReplaceAll(text, key, "<redacted>")
	if _, secret, ok := strings.Cut(key, "."); ok && len(secret) >= 8 {
		text = strings.ReplaceAll(text, secret, "<redacted>")
	}
	return text
}

// known returns cmd when it names a command, "" otherwise.
func known(cmd string) string {
	if _, ok := commandFlags[cmd]; ok {
		return cmd
	}
	if _, ok := offlineCommands[cmd]; ok {
		return cmd
	}
	return ""
}

// allCommands names every command, those that call the ledger first.
func allCommands() []string {
	return append(slices.Clone(commands), slices.Sorted(maps.Keys(offlineCommands))...)
}

// split separates flags (with their values) from positional arguments, so
// that flags may follow arguments. Everything after "--" is positional.
func split(fs *flag.FlagSet, args []string) (flags, positional []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return flags, append(positional, args[i+1:]...)
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimPrefix(a[1:], "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // fs.Parse reports it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, positional
}

// run is the whole command: it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, env func(string) string) int {
	if len(args) > 0 {
		if offline, ok := offlineCommands[args[0]]; ok {
			return offline.run(args[1:], os.Stdin, stdout, stderr)
		}
	}
	o, err := parse(args, env)
	if err != nil {
		var h errHelp
		if errors.As(err, &h) {
			fmt.Fprint(stdout, usage(h.cmd))
			return exitOK
		}
		var u *usageError
		if errors.As(err, &u) {
			fmt.Fprintf(stderr, "ledgerctl: %s\n\n%s", redact(u.msg, o.apiKey), usage(u.cmd))
			return exitUsage
		}
		fmt.Fprintf(stderr, "ledgerctl: %s\n", redact(err.Error(), o.apiKey))
		return exitUsage
	}
	var cmd func(context.Context, *client.Client, *options, io.Writer, io.Writer) error
	switch o.cmd {
	case "lookup":
		err = checkOneID(o, "an", "operation id")
		cmd = lookup
	case "list-unresolved":
		err = checkList(o)
		cmd = listUnresolved
	case "reconcile":
		var f client.Finding
		f, err = checkReconcile(o)
		cmd = func(ctx context.Context, c *client.Client, o *options, stdout, stderr io.Writer) error {
			return reconcile(ctx, c, o, f, stdout, stderr)
		}
	case "get-run":
		err = checkOneID(o, "a", "run id")
		cmd = getRun
	case "list-runs":
		err = checkListRuns(o)
		cmd = listRuns
	case "end-run":
		var st client.RunState
		st, err = checkEndRun(o)
		cmd = func(ctx context.Context, c *client.Client, o *options, stdout, _ io.Writer) error {
			return endRun(ctx, c, o, st, stdout)
		}
	}
	if err != nil {
		var u *usageError
		if errors.As(err, &u) {
			fmt.Fprintf(stderr, "ledgerctl: %s\n\n%s", redact(u.msg, o.apiKey), usage(u.cmd))
			return exitUsage
		}
		report(stderr, o, err)
		return exitError
	}
	c, err := dial(o)
	if err != nil {
		report(stderr, o, err)
		return exitError
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := cmd(ctx, c, o, stdout, stderr); err != nil {
		report(stderr, o, err)
		return exitError
	}
	return exitOK
}

// checkOneID refuses a command line without exactly one id (an "operation
// id" or a "run id", with its article).
func checkOneID(o *options, article, id string) error {
	switch {
	case len(o.args) == 0 || o.args[0] == "":
		return usagef(o.cmd, "%s needs %s %s", o.cmd, article, id)
	case len(o.args) > 1:
		return usagef(o.cmd, "%s takes one %s, not %d arguments (quote an id with spaces)", o.cmd, id, len(o.args))
	}
	return nil
}

// checkListing refuses arguments, and a --limit below 1, of a listing.
func checkListing(o *options) error {
	if len(o.args) > 0 {
		return usagef(o.cmd, "%s takes no arguments, only flags (got %q)", o.cmd, o.args[0])
	}
	if o.limit <= 0 {
		return usagef(o.cmd, "--limit must be positive")
	}
	return nil
}

func checkList(o *options) error {
	if err := checkListing(o); err != nil {
		return err
	}
	var err error
	if o.opStates, err = parseStates(o.states, parseState, "pending, running or unknown"); err != nil {
		return usagef(o.cmd, "%v", err)
	}
	if o.overdue || o.needsReview {
		// Both select UNKNOWN operations only.
		what := "--overdue"
		if !o.overdue {
			what = "--needs-review"
		}
		if len(o.opStates) > 0 && !slices.Contains(o.opStates, client.StateUnknown) {
			return usagef(o.cmd, "%s selects UNKNOWN operations: it cannot be combined with --state without unknown", what)
		}
	}
	return nil
}

// findings maps the command line's finding names to the SDK's.
var findings = map[string]client.FindingKind{
	"applied":     client.Applied,
	"not-applied": client.NotApplied,
	"not_applied": client.NotApplied,
	"abandon":     client.Abandon,
	"escalate":    client.Escalate,
}

func checkReconcile(o *options) (client.Finding, error) {
	if len(o.args) != 2 || o.args[0] == "" {
		return client.Finding{}, usagef(o.cmd, "reconcile needs an operation id and a finding (applied, not-applied, abandon or escalate)")
	}
	kind, ok := findings[strings.ToLower(o.args[1])]
	if !ok {
		return client.Finding{}, usagef(o.cmd, "unknown finding %q: want applied, not-applied, abandon or escalate", o.args[1])
	}
	f := client.Finding{Kind: kind, Note: o.note, FencingToken: o.fencingToken}
	if o.resourceSet && kind != client.Applied {
		return f, usagef(o.cmd, "--resource-id and --data go with the applied finding only")
	}
	if o.failureSet && kind != client.Abandon {
		return f, usagef(o.cmd, "--failure-code and --failure-message go with the abandon finding only")
	}
	switch kind {
	case client.Applied:
		f.Result.ResourceID = o.resourceID
		if o.data != "" {
			data, err := parseData(o.data)
			if err != nil {
				return f, usagef(o.cmd, "--data: %v", err)
			}
			f.Result.Data = data
		}
	case client.Abandon:
		if o.failureSet {
			f.Failure = &client.Failure{Code: o.failureCode, Message: o.failureMsg}
		}
	}
	return f, nil
}

// decodeObject decodes dec's next value, refusing (with its kind, never
// its text) one that is not a JSON object.
func decodeObject(dec *json.Decoder) (map[string]any, error) {
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	kind := "null"
	switch v := v.(type) {
	case map[string]any:
		return v, nil
	case []any:
		kind = "an array"
	case string:
		kind = "a string"
	case json.Number:
		kind = "a number"
	case bool:
		kind = "true or false"
	}
	return nil, fmt.Errorf("not a JSON object ({...}): %s", kind)
}

// parseData reads --data: one JSON object, in UTF-8, each key once in each
// object. The ledger keeps its numbers as 64-bit floats: a number that
// would be recorded as another one is refused.
func parseData(s string) (map[string]any, error) {
	if !utf8.ValidString(s) {
		// Decoding would record U+FFFD in place of the bytes.
		return nil, errors.New("not valid UTF-8 (text in another encoding?): give it in UTF-8")
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	m, err := decodeObject(dec)
	if err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	if esc, ok := loneSurrogate(s); ok {
		// Decoding would record U+FFFD in its place, as for invalid UTF-8.
		return nil, fmt.Errorf("the escape %s is half of a UTF-16 surrogate pair, not a character: give the character itself, or both halves", esc)
	}
	if key, ok := duplicateKey(s); ok {
		return nil, fmt.Errorf("duplicate key %q in one object: only one value would be recorded; give each key once", key)
	}
	if err := exactNumbers(m); err != nil {
		return nil, err
	}
	return m, nil
}

// loneSurrogate returns the first \u escape in the JSON text s (valid:
// parseData decoded it) of a UTF-16 surrogate that is not one half of a
// high-low pair, which encoding/json decodes as U+FFFD.
func loneSurrogate(s string) (string, bool) {
	// surrogate reads the \uXXXX at s[i:], if there is one: 1 for a high
	// surrogate, 2 for a low one, 0 otherwise.
	surrogate := func(i int) int {
		if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
			return 0
		}
		r, err := strconv.ParseUint(s[i+2:i+6], 16, 16)
		switch {
		case err != nil:
			return 0
		case 0xd800 <= r && r < 0xdc00:
			return 1
		case 0xdc00 <= r && r < 0xe000:
			return 2
		}
		return 0
	}
	inString := false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"':
			inString = !inString
		case inString && s[i] == '\\':
			switch surrogate(i) {
			case 1:
				if surrogate(i+6) != 2 {
					return s[i : i+6], true
				}
				i += 11 // the pair
			case 2:
				return s[i : i+6], true
			default:
				i++ // the escaped character (\uXXXX's digits are no quote)
			}
		}
	}
	return "", false
}

// duplicateKey returns a member name that appears twice in one object of
// the JSON text s (valid: parseData decoded it), at any depth, as decoded
// (so "a" and "\u0061" are one name).
func duplicateKey(s string) (string, bool) {
	type object struct {
		keys    map[string]bool
		wantKey bool
	}
	var stack []*object // nil for an array
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false // the end
		}
		var top *object
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			continue
		}
		if top != nil && top.wantKey {
			key := tok.(string)
			if top.keys[key] {
				return key, true
			}
			top.keys[key], top.wantKey = true, false
			continue
		}
		if top != nil {
			top.wantKey = true // after this value
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &object{keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			stack = append(stack, nil)
		}
	}
}

// exactNumbers replaces the json.Numbers in v (a map or slice from
// parseData) with their float64, or fails for a number that float64 does
// not hold as written: its shortest form must have the same value.
func exactNumbers(v any) error {
	conv := func(n json.Number) (float64, error) {
		f, err := strconv.ParseFloat(n.String(), 64)
		switch {
		case err != nil: // out of range
		case f == 0:
			// An underflow parses as 0 too: the digits must all be 0.
			mantissa, _, _ := strings.Cut(strings.ToLower(n.String()), "e")
			if strings.Trim(mantissa, "-0.") == "" {
				return f, nil
			}
		default:
			// f is finite: so is the literal's exponent, near its digits'.
			lit, ok1 := new(big.Rat).SetString(n.String())
			back, ok2 := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
			if ok1 && ok2 && lit.Cmp(back) == 0 {
				return f, nil
			}
		}
		return 0, fmt.Errorf("the number %s is not exactly a 64-bit float, as the ledger keeps it (it would be recorded as %s): give it as a string",
			n, strconv.FormatFloat(f, 'g', -1, 64))
	}
	switch v := v.(type) {
	case map[string]any:
		// In name order, so that of two such numbers the same one is named.
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if n, ok := v[k].(json.Number); ok {
				f, err := conv(n)
				if err != nil {
					return err
				}
				v[k] = f
			} else if err := exactNumbers(v[k]); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range v {
			if n, ok := e.(json.Number); ok {
				f, err := conv(n)
				if err != nil {
					return err
				}
				v[i] = f
			} else if err := exactNumbers(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkAddr refuses an --addr that is not HOST:PORT with a port from 1 to
// 65535 before anything is sent: gRPC would take it, and only fail the
// call (UNAVAILABLE, as if the ledger could not be reached) or dial a port
// of its own choosing (443 for a HOST alone). A target that gRPC resolves
// by its scheme ("dns:///host:port", "dns:host:port", "unix:///path",
// "unix:relative/path", "unix-abstract:name", "passthrough:///host:port")
// is left to gRPC, which tells it as gRPC does: a URL whose scheme has a
// resolver ("localhost:50051" parses as the scheme "localhost", which has
// none).
func checkAddr(addr string) error {
	if u, err := url.Parse(addr); err == nil && resolver.Get(u.Scheme) != nil {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	var ae *net.AddrError
	switch {
	case errors.As(err, &ae) && ae.Err == "missing port in address":
		return errors.New("no port")
	case errors.As(err, &ae):
		return errors.New(ae.Err) // too many colons, a missing ']'...
	case err != nil:
		return err
	}
	if host == "" || strings.ContainsAny(host, " \t") {
		return errors.New("want a host name or IP address before the port")
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return errors.New("want a port from 1 to 65535")
	}
	return nil
}

// Hints of ledgerctl's own errors: what the flag takes.
const (
	caHint = "give --tls-ca (or LEDGER_TLS_CA) the PEM certificate of the CA that issued the ledger's certificate," +
		" or leave it out for the system's roots"
	certHint = "give --tls-cert and --tls-key a PEM client certificate and its private key, or leave both out" +
		" to authenticate with the API key alone"
)

// addrHint says what --addr takes, for BAD_ADDRESS.
const addrHint = "give --addr (or LEDGER_ADDR) as HOST:PORT, e.g. 127.0.0.1:50051 or ledger.internal:50051," +
	" or as a gRPC target with a scheme: dns:///HOST:PORT, unix:PATH, unix-abstract:NAME"

// dial makes the client; the connection is made on the first call.
func dial(o *options) (*client.Client, error) {
	if err := checkAddr(o.addr); err != nil {
		return nil, &localError{reason: "BAD_ADDRESS", msg: o.addrFrom + " " + o.addr + ": " + err.Error(), hint: addrHint}
	}
	var opts []client.Option
	if o.tls || o.tlsCA != "" || o.tlsCert != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.tlsCA != "" {
			pem, err := os.ReadFile(o.tlsCA)
			if err != nil {
				return nil, &localError{reason: "TLS_CONFIG", msg: "--tls-ca: " + err.Error(), hint: caHint}
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, &localError{reason: "TLS_CONFIG", msg: "--tls-ca " + o.tlsCA + ": no PEM certificate in it", hint: caHint}
			}
			cfg.RootCAs = pool
		}
		if o.tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
			if err != nil {
				return nil, &localError{reason: "TLS_CONFIG", msg: "--tls-cert/--tls-key: " + err.Error(), hint: certHint}
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, client.WithTLS(cfg))
	}
	if o.apiKey != "" {
		opts = append(opts, client.WithAPIKey(o.apiKey))
	}
	c, err := client.Dial(o.addr, opts...)
	if errors.Is(err, client.ErrInsecureAPIKey) {
		return nil, &localError{reason: "API_KEY_NOT_SENT", msg: "refusing to send the API key without TLS to " + o.addr +
			"; add --tls (and --tls-ca): the API key is only sent over TLS beyond this machine"}
	}
	if err != nil {
		return nil, &localError{reason: "BAD_ADDRESS", msg: o.addrFrom + " " + o.addr + ": " + err.Error(), hint: addrHint}
	}
	return c, nil
}

// lookup prints one operation with its history.
func lookup(ctx context.Context, c *client.Client, o *options, stdout, stderr io.Writer) error {
	op, err := c.Lookup(ctx, o.args[0])
	if err != nil {
		return err
	}
	var notes notices
	ref := reference(clock(), op)
	if n := ref.notice(); n != "" {
		notes.add(o, stderr, noticeClockBehind, "%s", n)
	}
	return printOperation(stdout, o, op, ref, nil, notes)
}

// listUnresolved pages through the unresolved operations the ledger
// selects, and prints at most --limit of them. The ledger applies every
// filter; ledgerctl checks --overdue and --needs-review on each operation
// too, since a ledger older than those filters ignores them and lists every
// UNKNOWN operation (the check costs nothing; --overdue's is left out when
// this machine's clock is seen behind the store's, and then for the whole
// listing, so one listing never mixes two clocks).
func listUnresolved(ctx context.Context, c *client.Client, o *options, stdout, stderr io.Writer) error {
	ls, err := readUnresolved(ctx, c, o)
	if err != nil {
		return err
	}
	var notes notices
	ref := referenceAt(ls.now, ls.seen)
	clockNotice := func() {
		if n := ref.notice(); n != "" {
			if o.overdue {
				n += "; --overdue lists what the ledger selected by the store's clock (a ledger older than that filter lists every UNKNOWN operation)"
			}
			notes.add(o, stderr, noticeClockBehind, "%s", n)
		}
	}
	if o.json {
		clockNotice()
		if ls.truncated {
			notes.add(o, stderr, noticeMoreRemain, "showing the oldest %d; more remain (raise --limit)", len(ls.ops))
		}
		return printList(stdout, o, ls.ops, ls.truncated, ref, notes)
	}
	if len(ls.ops) == 0 {
		clockNotice()
		fmt.Fprintln(stderr, "ledgerctl: no unresolved operations match")
		return nil
	}
	if err := printList(stdout, o, ls.ops, ls.truncated, ref, nil); err != nil {
		return err
	}
	clockNotice()
	if ls.truncated {
		notes.add(o, stderr, noticeMoreRemain, "showing the oldest %d; more remain (raise --limit)", len(ls.ops))
	}
	return nil
}

// unresolvedListing is what readUnresolved read.
type unresolvedListing struct {
	ops       []*client.Operation // at most --limit
	truncated bool                // more remain
	now       time.Time           // this machine's clock when the reading began
	seen      time.Time           // the latest time the store recorded in the pages read
}

// readUnresolved pages through the unresolved operations the ledger selects
// for o, up to --limit of them.
func readUnresolved(ctx context.Context, c *client.Client, o *options) (unresolvedListing, error) {
	states := o.opStates
	if o.overdue || o.needsReview {
		states = []client.State{client.StateUnknown} // checkList made sure --state allows it
	}
	ls := unresolvedListing{now: clock()}
	ls.seen = ls.now
	token := ""
	// The ledger selects --overdue by the store's clock. The check here is
	// for a ledger older than the filter, by this machine's clock: it is
	// left out once that clock is seen behind the store's, when it would
	// drop operations the store has overdue. dropped tells whether it left
	// out any on the pages read before.
	recheck, dropped := o.overdue, false
	for {
		size := uint32(min(o.limit-len(ls.ops)+1, maxPageSize)) // one more tells whether more remain
		p, err := c.ListUnresolved(ctx, client.ListOptions{PageSize: size, PageToken: token, States: states, Tool: o.tool,
			Overdue: o.overdue, NeedsReview: o.needsReview})
		if err != nil {
			return ls, err
		}
		ls.seen = latestRecorded(ls.seen, p.Operations...)
		if recheck && referenceAt(ls.now, ls.seen).behind > 0 {
			recheck = false
			if dropped {
				// Earlier pages were judged by a clock now known to be
				// behind: read the listing again from its start, by the
				// ledger's selection only.
				ls.ops, token, dropped = nil, "", false
				continue
			}
		}
		for _, op := range p.Operations {
			if o.needsReview && !op.NeedsReview {
				continue
			}
			if recheck && !overdue(op, ls.now) {
				dropped = true
				continue
			}
			if len(ls.ops) == o.limit {
				ls.truncated = true
				break
			}
			ls.ops = append(ls.ops, op)
		}
		if ls.truncated || p.NextPageToken == "" {
			return ls, nil
		}
		if p.NextPageToken == token {
			return ls, &localError{reason: "BAD_PAGE", msg: "the ledger returned the same page token twice"}
		}
		token = p.NextPageToken
	}
}

// sameResult reports whether the recorded result r is the one given.
func sameResult(r *client.Result, given client.Result) bool {
	if r == nil || r.ResourceID != given.ResourceID {
		return false
	}
	if len(r.Data) == 0 || len(given.Data) == 0 {
		return len(r.Data) == len(given.Data)
	}
	a, err1 := json.Marshal(r.Data)
	b, err2 := json.Marshal(given.Data)
	return err1 == nil && err2 == nil && string(a) == string(b)
}

// sameFailure reports whether the recorded failure is the one given (its
// code ABANDONED when none is given).
func sameFailure(r, given *client.Failure) bool {
	code := given.Code
	if code == "" {
		code = "ABANDONED"
	}
	return r != nil && r.Code == code && r.Message == given.Message
}

// otherOutcome reports whether err is the ledger's refusal of a finding of
// the operation's own kind (applied on SUCCEEDED, abandon on FAILED_FINAL)
// with another result or failure than the one that stands.
func otherOutcome(err error, kind client.FindingKind) bool {
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Reason != "ALREADY_RESOLVED" {
		return false
	}
	st := refusedState(err)
	return kind == client.Applied && st == client.StateSucceeded.String() ||
		kind == client.Abandon && st == client.StateFailedFinal.String()
}

// refusedState is the state metadata of a ledger's refusal ("" for none).
func refusedState(err error) string {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return ""
	}
	return ce.Metadata["state"]
}

// overdue reports whether op is UNKNOWN past its recovery deadline, by this
// machine's clock.
func overdue(op *client.Operation, now time.Time) bool {
	return op.State == client.StateUnknown && !op.RecoveryDeadline.IsZero() && !now.Before(op.RecoveryDeadline)
}

// reconcile records the finding, then prints the record with its history.
func reconcile(ctx context.Context, c *client.Client, o *options, f client.Finding, stdout, stderr io.Writer) error {
	id := o.args[0]
	op, refused, err := recordFinding(ctx, c, id, f)
	if err != nil {
		return err
	}
	var notes notices
	nothing := recordedNothing(o, stderr, &notes, op, f, refused)
	op = withHistory(ctx, c, o, stderr, &notes, id, op, nothing)
	if !o.json {
		review := ""
		if op.NeedsReview {
			review = " (needs review)"
		}
		if nothing {
			fmt.Fprintf(stdout, "not reconciled %s: %s recorded nothing; it is %s%s\n\n", clean(id), strings.ToLower(o.args[1]), stateName(op.State), review)
		} else {
			fmt.Fprintf(stdout, "reconciled %s: %s → %s%s\n\n", clean(id), strings.ToLower(o.args[1]), stateName(op.State), review)
		}
	}
	recorded := !nothing
	ref := reference(clock(), op)
	if n := ref.notice(); n != "" {
		notes.add(o, stderr, noticeClockBehind, "%s", n)
	}
	return printOperation(stdout, o, op, ref, &recorded, notes)
}

// recordFinding records f on the operation id and returns its record;
// refused is true when the ledger refused f for another outcome than the
// one that stands, and the record is what stands.
func recordFinding(ctx context.Context, c *client.Client, id string, f client.Finding) (op *client.Operation, refused bool, err error) {
	op, err = c.Reconcile(ctx, id, f)
	if err == nil {
		return op, false, nil
	}
	// Applied on a SUCCEEDED operation (abandon on a FAILED_FINAL one) with
	// another result (failure) than the one that stands is refused
	// (ALREADY_RESOLVED). Show what stands, as for a ledger older than that,
	// which answered OK with the record: another result than the one found
	// may be a second effect. When the record cannot be read, or no longer
	// holds the state refused (a late report of success turns an abandoned
	// operation SUCCEEDED), the refusal is the error; its hint says as much
	// (describe).
	if !otherOutcome(err, f.Kind) {
		return nil, false, err
	}
	full, lerr := c.Lookup(ctx, id)
	if lerr != nil || full.State.String() != refusedState(err) {
		return nil, false, err
	}
	return full, true, nil
}

// recordedNothing reports whether recording f changed nothing, and adds
// the notice that says why to notes.
func recordedNothing(o *options, stderr io.Writer, notes *notices, op *client.Operation, f client.Finding, refused bool) bool {
	// A finding is recorded with the state it makes, in the same step as
	// the snapshot: any other state means the ledger took the call for a
	// repeat of one this key recorded with this note (about this token's
	// attempt, or the current one without a token), and this call changed
	// nothing.
	if f.Kind == client.NotApplied && op.State != client.StatePending ||
		f.Kind == client.Escalate && (op.State != client.StateUnknown || !op.NeedsReview) {
		notes.add(o, stderr, noticeRepeat, "this call recorded nothing: the ledger took it for a repeat of the %s finding this key"+
			" already recorded with this note, and the operation has moved on since (it is %s, attempt %d). To record a finding"+
			" about the current attempt, look it up and give a new --note (and its --fencing-token)",
			strings.ToLower(o.args[1]), stateName(op.State), op.Attempt)
		return true
	}
	// Applied on a SUCCEEDED operation (abandon on a FAILED_FINAL one) with
	// another result (failure) changes nothing: the recorded one stands
	// (refused, or answered OK by an older ledger). Another one than given
	// may be another effect.
	switch {
	case f.FencingToken != 0 && op.FencingToken != f.FencingToken:
		// Resolved by another attempt than the one given (the ledger
		// answers a resolved operation before it checks the token).
		what := ""
		if op.Result != nil {
			what = " with " + resultText(op.Result)
		} else if op.Failure != nil {
			what = " with " + failureText(op.Failure)
		}
		notes.add(o, stderr, noticeOtherAttempt, "this call recorded nothing: attempt %d resolved the operation (%s%s), not the attempt with"+
			" --fencing-token %d; if the destination has the effect of that attempt too, that may be two effects: check it",
			op.Attempt, stateName(op.State), what, f.FencingToken)
	case f.Kind == client.Applied && (refused || o.resourceSet && !sameResult(op.Result, f.Result)):
		notes.add(o, stderr, noticeOtherResult, "this call recorded nothing: the operation was already SUCCEEDED with another result (%s),"+
			" which stands; if the destination has both, that may be two effects: check it", resultText(op.Result))
	case f.Kind == client.Abandon && (refused || o.failureSet && !sameFailure(op.Failure, f.Failure)):
		notes.add(o, stderr, noticeOtherFailure, "this call recorded nothing: the operation was already FAILED_FINAL with another failure (%s),"+
			" which stands", failureText(op.Failure))
	default:
		return false
	}
	return true
}

// withHistory returns op, the operation id, with its history. Reconcile's snapshot carries
// it, read in the same step as the finding; a ledger older than that
// answers without it (a record always has one): the record is read again
// for it then, and a failure to read it is a notice.
func withHistory(ctx context.Context, c *client.Client, o *options, stderr io.Writer, notes *notices, id string, op *client.Operation, nothing bool) *client.Operation {
	if len(op.History) > 0 {
		return op
	}
	full, err := c.Lookup(ctx, id)
	if err == nil {
		return full
	}
	// Reconcile answered: the error is the lookup's, without the hint of a
	// finding that may have been recorded.
	lo := *o
	lo.cmd = "lookup"
	what := "reconciled, but"
	if nothing {
		what = "this call recorded nothing, and"
	}
	notes.add(o, stderr, noticeNoHistory, "%s could not read the history: %s", what, describe(&lo, err).line())
	return op
}
