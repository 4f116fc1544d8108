package main

import (
	"fmt"
	"log/slog"
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
	keys, err := receipt.LoadKeys(strings.Split(c.receiptKeys, ","))
	if err != nil {
		return nil, fmt.Errorf("--receipt-keys: %w", err)
	}
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
