package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/opledger/ledger/receipt"
)

// offlineCommand is a command that reads files, never the ledger: run
// takes its arguments and returns the exit status.
type offlineCommand struct {
	run   func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
	usage string
}

// The offline commands.
var offlineCommands = map[string]offlineCommand{
	"verify-receipt": {verifyReceipt, verifyUsage},
	"verify-history": {verifyHistory, verifyHistoryUsage},
	"jwks":           {printJWKS, jwksUsage},
}

const verifyUsage = `usage: ledgerctl verify-receipt FILE --jwks FILE
  Verifies a receipt (a compact JWS; FILE "-" reads stdin) against the
  issuer's key set (the JWKS ledgerd serves at /.well-known/jwks.json, or
  ledgerctl jwks), offline, and prints what it signs as JSON. Exit status 1
  when it does not verify.
`

const jwksUsage = `usage: ledgerctl jwks KEYFILE...
  Prints the JWK Set of receipt key files (their public parts only), as
  ledgerd serves it.
`

// verifyReceipt is "ledgerctl verify-receipt".
func verifyReceipt(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify-receipt", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	jwksFile := fs.String("jwks", "", "the issuer's JWK Set")
	file, rest := "", args
	if len(rest) > 0 && rest[0] != "" && (rest[0] == "-" || rest[0][0] != '-') {
		file, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil || file == "" || fs.NArg() > 0 || *jwksFile == "" {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, verifyUsage)
			return exitOK
		}
		fmt.Fprintf(stderr, "ledgerctl: verify-receipt needs a receipt FILE and --jwks FILE\n\n%s", verifyUsage)
		return exitUsage
	}
	jws, err := readFileOrStdin(file, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "ledgerctl: RECEIPT_UNREADABLE: %v\n", err)
		return exitError
	}
	set, err := readJWKS(*jwksFile)
	if err != nil {
		fmt.Fprintf(stderr, "ledgerctl: JWKS_UNREADABLE: %v\n", err)
		return exitError
	}
	c, err := receipt.Verify(string(trimSpace(jws)), set)
	if err != nil {
		fmt.Fprintf(stderr, "ledgerctl: RECEIPT_INVALID: %v\n", err)
		return exitError
	}
	if err := writeJSON(stdout, c); err != nil {
		return exitError
	}
	return exitOK
}

// printJWKS is "ledgerctl jwks".
func printJWKS(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		if len(args) == 0 {
			fmt.Fprint(stderr, "ledgerctl: jwks needs a key file\n\n"+jwksUsage)
			return exitUsage
		}
		fmt.Fprint(stdout, jwksUsage)
		return exitOK
	}
	var keys []*receipt.Key
	for _, p := range args {
		b, err := os.ReadFile(p)
		if err == nil {
			var k *receipt.Key
			if k, err = receipt.ParseJWK(b); err == nil {
				keys = append(keys, k)
				continue
			}
		}
		fmt.Fprintf(stderr, "ledgerctl: KEY_UNREADABLE: %s: %v\n", p, err)
		return exitError
	}
	if err := writeJSON(stdout, receipt.JWKS(keys)); err != nil {
		return exitError
	}
	return exitOK
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
