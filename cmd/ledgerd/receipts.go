package main

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"

	"github.com/opledger/ledger/receipt"
)

// startReceipts loads the receipt keys of --receipt-keys: nil, said in the
// log, when there are none (receipts are off).
func startReceipts(c config, log *slog.Logger) (*receipt.Signer, error) {
	if c.receiptKeys == "" {
		log.Info("receipts are off: no --receipt-keys (ledgerd keygen --receipts makes a key)")
		return nil, nil
	}
	paths := strings.Split(c.receiptKeys, ",")
	keys, err := receipt.LoadKeys(paths)
	if err != nil {
		return nil, fmt.Errorf("--receipt-keys: %w", err)
	}
	warnReadable(paths, keys, log)
	s, err := receipt.NewSigner(c.receiptIssuer, keys)
	if err != nil {
		return nil, fmt.Errorf("--receipt-issuer: %w", err)
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.ID
	}
	log.Info("receipts are on", "issuer", c.receiptIssuer, "signing_key", keys[0].ID, "keys", strings.Join(ids, ","))
	return s, nil
}

// warnReadable logs each key file holding a private key that other users
// of the machine may read: they could sign receipts as this ledger.
func warnReadable(paths []string, keys []*receipt.Key, log *slog.Logger) {
	if runtime.GOOS == "windows" {
		return // the mode bits say nothing there
	}
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err == nil && keys[i].Private != nil && fi.Mode().Perm()&0o004 != 0 {
			log.Warn("other users may read this receipt signing key, and sign receipts as this ledger: chmod o-r it",
				"file", p, "mode", fi.Mode().Perm().String())
		}
	}
}
