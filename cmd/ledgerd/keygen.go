package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/opledger/ledger/receipt"
	"github.com/opledger/ledger/server"
)

// keygenOptions are the flags of "ledgerd keygen".
type keygenOptions struct {
	id, tenant, scopes string
	receipts           bool
}

// newKeygenFlagSet returns the flag set of "ledgerd keygen", which parses
// into o and writes its messages to stderr.
func newKeygenFlagSet(o *keygenOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ledgerd keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.id, "id", "", "key id: letters, digits, '-' and '_' (required)")
	fs.StringVar(&o.tenant, "tenant", "", "tenant the key acts for (required)")
	fs.StringVar(&o.scopes, "scopes", "agent", "comma-separated scopes: agent, reconciler, viewer")
	fs.BoolVar(&o.receipts, "receipts", false, "make an Ed25519 receipt signing key instead (a JWK on stdout; --id is its key id, random when empty)")
	return fs
}

// keygen prints a new API key and its credentials file entry.
func keygen(args []string, stdout, stderr io.Writer) error {
	var o keygenOptions
	fs := newKeygenFlagSet(&o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // the usage is printed: -h succeeds, as ledgerd -h does
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("keygen: unexpected arguments %v: keygen takes flags only (--id, --tenant, --scopes, --receipts)", fs.Args())
	}
	if o.receipts {
		if err := receiptFlags(fs); err != nil {
			return err
		}
		return receiptKeygen(o.id, stdout, stderr)
	}
	if o.id == "" || o.tenant == "" {
		return errors.New("keygen: --id and --tenant are required")
	}
	scopes, err := keygenScopes(o.scopes)
	if err != nil {
		return err
	}
	entry := fmt.Sprintf("keys:\n  - {id: %s, tenant: %q, scopes: [%s], secret_sha256: %s}\n", o.id, o.tenant, scopes, strings.Repeat("0", 64))
	if _, err := server.ParseCredentials([]byte(entry)); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	key, hash, err := server.NewAPIKey(o.id)
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	fmt.Fprintf(stdout, "# API key for the client (shown once, stored nowhere):\n#   %s\n", key)
	fmt.Fprintf(stdout, "# entry for the credentials file (the keys: list):\n  - {id: %s, tenant: %q, scopes: [%s], secret_sha256: %s}\n", o.id, o.tenant, scopes, hash)
	return nil
}

// keygenScopes returns --scopes as the entry lists them ("agent, viewer"),
// refusing an empty scope and one with other characters than lowercase
// letters, which the entry's YAML would read as something else; the
// credentials file's check names an unknown one.
func keygenScopes(list string) (string, error) {
	scopes := strings.Split(list, ",")
	for i, s := range scopes {
		scopes[i] = strings.TrimSpace(s)
		if scopes[i] == "" || strings.Trim(scopes[i], "abcdefghijklmnopqrstuvwxyz") != "" {
			return "", fmt.Errorf("keygen: --scopes %q: want a comma-separated list of agent, reconciler and viewer", list)
		}
	}
	return strings.Join(scopes, ", "), nil
}

// receiptFlags refuses the flags of an API key (--tenant, --scopes) given
// with --receipts, which fs has parsed.
func receiptFlags(fs *flag.FlagSet) error {
	var apiOnly []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "tenant" || f.Name == "scopes" {
			apiOnly = append(apiOnly, "--"+f.Name)
		}
	})
	switch len(apiOnly) {
	case 1:
		return fmt.Errorf("keygen: %s belongs to an API key; --receipts makes a receipt signing key, which takes --id only", apiOnly[0])
	case 2:
		return fmt.Errorf("keygen: %s belong to an API key; --receipts makes a receipt signing key, which takes --id only", strings.Join(apiOnly, " and "))
	}
	return nil
}

// receiptKeygen prints a new receipt signing key as a JWK (kid id, random
// when empty); the instructions go to stderr, so stdout is the key file.
func receiptKeygen(id string, stdout, stderr io.Writer) error {
	k, err := receipt.NewKey(id)
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	b, err := k.MarshalJWK()
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	fmt.Fprintf(stderr, "# receipt signing key %s: save stdout to a file only ledgerd can read, and pass it first in --receipt-keys\n", k.ID)
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}
