package server

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/opledger/ledger/fingerprint"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzStructParams: for any Struct a client can send as JSON, the edge's
// conversion never panics, agrees with structpb's own conversion (JSON holds
// no NaN or infinity, the one place they differ), and fingerprints the same.
func FuzzStructParams(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"amount":42,"currency":"EUR"}`, `{"a":{"b":[1,2,{"c":null}]}}`,
		`{"x":1e308,"y":-0,"z":5e-324}`, `{"k~/":"v","":true}`, `{"€":"\u2028"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := &structpb.Struct{}
		if err := protojson.Unmarshal(data, s); err != nil {
			return
		}
		var errs requestErrors
		m, ok := structMap("params", s, &errs)
		if !ok {
			if len(errs) != 1 || !bytes.Contains([]byte(errs[0].Description), []byte("nested deeper")) {
				t.Fatalf("refused %s: %v", data, errs)
			}
			return
		}
		if want := s.AsMap(); !reflect.DeepEqual(m, want) {
			t.Fatalf("structMap(%s) = %v, AsMap = %v", data, m, want)
		}
		a, errA := fingerprint.Canonical(m)
		b, errB := fingerprint.Canonical(s.AsMap())
		if (errA == nil) != (errB == nil) || !bytes.Equal(a, b) {
			t.Fatalf("canonical forms differ: %s / %s (%v, %v)", a, b, errA, errB)
		}
	})
}
