package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/opledger/ledger/chain"
	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
	"github.com/opledger/ledger/receipt"
)

const verifyHistoryUsage = `usage: ledgerctl verify-history FILE [--receipt FILE]... [--jwks FILE]
  Checks an operation's history chain, offline: FILE ("-" reads stdin) is
  what "ledgerctl lookup --json" printed, or the HTTP API's Lookup answer.
  It recomputes the chain from history_base over the entries, compares the
  head, and finds each receipt's history_head among the chain's values (a
  receipt needs --jwks, the issuer's key set). Exit status 1 when the chain
  or a receipt does not check.
`

// historyDoc is one operation's history as a Lookup answer gives it.
type historyDoc struct {
	id, base, head string
	entries        []chain.Entry
	receipt        string // the receipt the HTTP API's answer carried
}

// verifyHistory is "ledgerctl verify-history".
func verifyHistory(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify-history", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	jwksFile := fs.String("jwks", "", "the issuer's JWK Set")
	var receipts []string
	fs.Func("receipt", "a receipt of the operation", func(v string) error {
		receipts = append(receipts, v)
		return nil
	})
	file, rest := "", args
	if len(rest) > 0 && rest[0] != "" && (rest[0] == "-" || rest[0][0] != '-') {
		file, rest = rest[0], rest[1:]
	}
	err := fs.Parse(rest)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, verifyHistoryUsage)
		return exitOK
	}
	if err != nil || file == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ledgerctl: verify-history needs a FILE\n\n%s", verifyHistoryUsage)
		return exitUsage
	}
	raw, err := readFileOrStdin(file, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ledgerctl: HISTORY_UNREADABLE: %v\n", err)
		return exitError
	}
	doc, err := parseHistoryDoc(raw)
	if err != nil {
		fmt.Fprintf(stderr, "ledgerctl: HISTORY_UNREADABLE: %v\n", err)
		return exitError
	}
	var jwss []string
	if doc.receipt != "" {
		jwss = append(jwss, doc.receipt)
	}
	for _, p := range receipts {
		b, err := os.ReadFile(p)
		if err != nil {
			fmt.Fprintf(stderr, "ledgerctl: RECEIPT_UNREADABLE: %v\n", err)
			return exitError
		}
		jwss = append(jwss, string(trimSpace(b)))
	}
	var set jose.JSONWebKeySet
	if len(jwss) > 0 {
		if set, err = readJWKS(*jwksFile); err != nil {
			fmt.Fprintf(stderr, "ledgerctl: JWKS_UNREADABLE: %v\n", err)
			return exitError
		}
	}
	return checkHistory(doc, jwss, set, stdout, stderr)
}

// checkHistory prints the chain and checks it and the receipts against it.
func checkHistory(doc *historyDoc, jwss []string, set jose.JSONWebKeySet, stdout, stderr io.Writer) int {
	values := chain.Values(doc.base, doc.entries)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ENTRY\tTIME\tREASON\tCHAIN VALUE\n")
	fmt.Fprintf(tw, "base\t-\t-\t%s\n", values[0])
	for i, e := range doc.entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", i+1, stamp(time.UnixMilli(e.TimeMillis)), clean(e.Reason), values[i+1])
	}
	_ = tw.Flush()
	status := exitOK
	if head := values[len(values)-1]; doc.head != "" && doc.head != head {
		fmt.Fprintf(stderr, "ledgerctl: HISTORY_MISMATCH: the entries hash to %s, not to the head %s the answer gives\n", head, doc.head)
		status = exitError
	}
	for i, jws := range jwss {
		c, err := receipt.Verify(jws, set)
		switch {
		case err != nil:
			fmt.Fprintf(stderr, "ledgerctl: RECEIPT_INVALID: receipt %d: %v\n", i+1, err)
			status = exitError
		case c.OperationID != doc.id:
			fmt.Fprintf(stderr, "ledgerctl: RECEIPT_OTHER_OPERATION: receipt %d is of %q\n", i+1, clean(c.OperationID))
			status = exitError
		default:
			what := fmt.Sprintf("receipt %d (%s, attempt %d, %s)", i+1, c.State, c.Attempt, c.IssuedAt)
			if code, msg := placeReceipt(c, values, doc.entries); code == "" {
				fmt.Fprintf(stdout, "%s: %s\n", what, msg)
			} else {
				fmt.Fprintf(stderr, "ledgerctl: %s: %s: %s\n", code, what, msg)
				status = exitError
			}
		}
	}
	if status == exitOK {
		fmt.Fprintf(stdout, "the history chain checks: head %s\n", values[len(values)-1])
	}
	return status
}

// placeReceipt finds a receipt's chain head among the chain's values. It
// returns where, or the reason code and why not.
func placeReceipt(c *receipt.Claims, values []string, entries []chain.Entry) (code, msg string) {
	i := slices.Index(values, c.HistoryHead)
	switch {
	case c.HistoryHead == "":
		return "RECEIPT_WITHOUT_HEAD", "it signs no history head"
	case i == 0 && values[0] != chain.Genesis:
		return "", "signed before the oldest entry kept; its head is the base"
	case i >= 0:
		return "", "its head is the chain value after entry " + strconv.Itoa(i)
	}
	iat, err := time.Parse(time.RFC3339, c.IssuedAt)
	if values[0] != chain.Genesis && len(entries) > 0 && err == nil && iat.UnixMilli() < entries[0].TimeMillis {
		return "RECEIPT_BEFORE_KEPT_HISTORY", "signed before the oldest entry kept, so its head cannot be checked here"
	}
	return "RECEIPT_NOT_IN_HISTORY", "its head is none of the chain's values: an entry was changed or dropped after it was signed"
}

// parseHistoryDoc reads the operation, its history and its chain from a
// Lookup answer: ledgerctl's JSON (snake_case, numbers), or the HTTP API's
// (lowerCamelCase, 64-bit numbers as strings, zero values left out, the
// operation under "operation" with the receipt beside it).
func parseHistoryDoc(raw []byte) (*historyDoc, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	top, err := decodeObject(dec)
	if err != nil {
		return nil, err
	}
	doc := &historyDoc{}
	if op, ok := top["operation"].(map[string]any); ok {
		doc.receipt, _ = top["receipt"].(string)
		top = op
	}
	doc.id = str(top, "operation_id", "operationId")
	doc.base, doc.head = str(top, "history_base", "historyBase"), str(top, "history_head", "historyHead")
	if doc.id == "" || doc.head == "" {
		return nil, errors.New("no operation_id and history_head: not a Lookup answer with its history")
	}
	list, _ := field(top, "history", "history").([]any)
	for i, v := range list {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("history entry %d is not an object", i+1)
		}
		e, err := historyEntry(m)
		if err != nil {
			return nil, fmt.Errorf("history entry %d: %w", i+1, err)
		}
		doc.entries = append(doc.entries, e)
	}
	return doc, nil
}

func historyEntry(m map[string]any) (chain.Entry, error) {
	t, err := time.Parse(time.RFC3339Nano, str(m, "time", "time"))
	if err != nil {
		return chain.Entry{}, fmt.Errorf("time: %w", err)
	}
	e := chain.Entry{TimeMillis: t.UnixMilli(), Reason: str(m, "reason", "reason"),
		Principal: str(m, "principal", "principal"), Detail: str(m, "detail", "detail")}
	for _, s := range []struct {
		snake, camel string
		into         *int32
	}{{"from_state", "fromState", &e.From}, {"to_state", "toState", &e.To}} {
		name := str(m, s.snake, s.camel)
		n, ok := ledgerv1.State_value[name]
		if name != "" && !ok {
			return chain.Entry{}, fmt.Errorf("%s: unknown state %q", s.snake, name)
		}
		*s.into = n
	}
	att, err := number(m, "attempt", "attempt", 32)
	if err != nil {
		return chain.Entry{}, err
	}
	tok, err := number(m, "fencing_token", "fencingToken", 64)
	if err != nil {
		return chain.Entry{}, err
	}
	e.Attempt, e.FencingToken = uint32(att), tok
	return e, nil
}

func field(m map[string]any, snake, camel string) any {
	if v, ok := m[snake]; ok {
		return v
	}
	return m[camel]
}

func str(m map[string]any, snake, camel string) string {
	s, _ := field(m, snake, camel).(string)
	return s
}

// number reads an unsigned number given as a JSON number or a decimal
// string; absent is 0.
func number(m map[string]any, snake, camel string, bits int) (uint64, error) {
	switch v := field(m, snake, camel).(type) {
	case nil:
		return 0, nil
	case string:
		return parseNumber(snake, v, bits)
	case json.Number:
		return parseNumber(snake, string(v), bits)
	}
	return 0, fmt.Errorf("%s: not a number", snake)
}

func parseNumber(name, s string, bits int) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, bits)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a whole number of %d bits", name, s, bits)
	}
	return n, nil
}

func readFileOrStdin(file string, stdin io.Reader) ([]byte, error) {
	if file == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(file)
}

func readJWKS(file string) (jose.JSONWebKeySet, error) {
	var set jose.JSONWebKeySet
	if file == "" {
		return set, errors.New("a receipt needs --jwks, the issuer's key set")
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return set, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	top, err := decodeObject(dec)
	if err != nil {
		return set, fmt.Errorf("%s is not a JWK Set: %v", file, err)
	}
	if err := json.Unmarshal(raw, &set); err != nil {
		return set, fmt.Errorf("%s is not a JWK Set: %v", file, err)
	}
	if len(set.Keys) == 0 {
		return set, noKeys(file, top)
	}
	for _, k := range set.Keys {
		if !k.IsPublic() {
			return set, fmt.Errorf("%s holds a private key (kid %q): keep the file secret, and verify with the public keys "+
				"(ledgerctl jwks KEYFILE prints them)", file, k.KeyID)
		}
	}
	return set, nil
}

// noKeys says what file, whose JSON object top has no JWK Set's keys, is
// instead.
func noKeys(file string, top map[string]any) error {
	switch {
	case top["kty"] == nil:
		return fmt.Errorf("%s is not a JWK Set: it has no keys", file)
	case top["d"] != nil:
		return fmt.Errorf("%s is a private key, not a JWK Set: keep it secret; \"ledgerctl jwks %s\" prints the set of its public key", file, file)
	}
	return fmt.Errorf("%s is one key, not a JWK Set: put it in {\"keys\": [...]}", file)
}
