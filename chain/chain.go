// Package chain computes the hash chain over an operation's history: each
// entry's chain value is the SHA-1 of the previous value and the entry, so
// a receipt that signs one value pins every entry before it
// (docs/receipts.md, "The history chain").
package chain

import (
	"crypto/sha1"
	"encoding/hex"
	"strconv"
)

// Genesis is the chain value before an operation's first history entry.
const Genesis = "0000000000000000000000000000000000000000"

// sep joins the hashed fields: 0xFF never occurs in UTF-8.
const sep = 0xFF

// Entry is one history entry as the chain hashes it: the fields of the
// wire's HistoryEntry, with the time in Unix milliseconds and the states
// as their enum numbers.
type Entry struct {
	TimeMillis   int64
	From, To     int32
	Reason       string
	Attempt      uint32
	FencingToken uint64
	Principal    string
	Detail       string
}

// Link returns the chain value after e, given the value prev before it:
// the lowercase hex SHA-1 of prev, the time, the from and to states, the
// reason, the attempt, the fencing token, the principal and the detail,
// joined by the byte 0xFF, with the numbers in decimal.
func Link(prev string, e Entry) string {
	b := make([]byte, 0, 96+len(e.Reason)+len(e.Principal)+len(e.Detail))
	b = append(b, prev...)
	b = strconv.AppendInt(append(b, sep), e.TimeMillis, 10)
	b = strconv.AppendInt(append(b, sep), int64(e.From), 10)
	b = strconv.AppendInt(append(b, sep), int64(e.To), 10)
	b = append(append(b, sep), e.Reason...)
	b = strconv.AppendUint(append(b, sep), uint64(e.Attempt), 10)
	b = strconv.AppendUint(append(b, sep), e.FencingToken, 10)
	b = append(append(b, sep), e.Principal...)
	b = append(append(b, sep), e.Detail...)
	sum := sha1.Sum(b)
	return hex.EncodeToString(sum[:])
}

// Values returns the chain values from base (Genesis when "") over
// entries: base first, then the value after each entry. The last one is
// the head.
func Values(base string, entries []Entry) []string {
	if base == "" {
		base = Genesis
	}
	out := make([]string, 1, len(entries)+1)
	out[0] = base
	for _, e := range entries {
		out = append(out, Link(out[len(out)-1], e))
	}
	return out
}

// Head returns the chain value after the last of entries, from base
// (Genesis when "").
func Head(base string, entries []Entry) string {
	v := Values(base, entries)
	return v[len(v)-1]
}
