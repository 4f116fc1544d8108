module github.com/opledger/ledger/internal/bench/peer

go 1.26

require (
	github.com/faustbrian/go-idempotency v0.0.0-20260715141327-26ee779f6bb7
	github.com/valkey-io/valkey-go v1.0.76
)
