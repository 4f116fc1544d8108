// Package client is what Go agent runtimes import to talk to the operation
// ledger: a connection to the service with its generated stubs, and the
// holder ids every Reserve should carry.
//
// A call of an operation goes: Reserve (with the operation id, tool, the
// consequential params, the permit and a holder from NewHolder) → on
// DECISION_EXECUTE run the tool, then Complete (success, final failure, or
// retryable failure proven not applied) or MarkUnknown (the outcome cannot be
// told); on DECISION_REPLAY return the recorded outcome; on
// DECISION_IN_PROGRESS wait retry_after and Reserve again; on
// DECISION_RECONCILE ask the destination whether the effect exists and call
// Reconcile. Never run the tool without an EXECUTE decision: when the ledger
// is unreachable, the call waits or fails, it does not execute.
package client

import (
	"crypto/rand"
	"encoding/hex"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
)

// Client is a connection to a ledger with its generated stubs.
type Client struct {
	ledgerv1.LedgerServiceClient
	conn *grpc.ClientConn
}

// Dial connects to the ledger at target (host:port). Without options the
// connection is plaintext, which ledgerd only allows on loopback; pass
// grpc.WithTransportCredentials for TLS. The connection is made lazily, on
// the first call.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{LedgerServiceClient: ledgerv1.NewLedgerServiceClient(conn), conn: conn}, nil
}

// Conn returns the underlying connection (for health checks, say).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// NewHolder returns a fresh holder id: 128 random bits. Generate one per
// call of an operation and reuse it only to retry that same call, so a lost
// Reserve response can be recovered; never share one between concurrent
// callers (a hostname or a process id would be shared).
func NewHolder() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("client: no randomness for a holder id: " + err.Error())
	}
	return "h-" + hex.EncodeToString(b[:])
}
