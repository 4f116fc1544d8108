package server

import (
	"bytes"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/opledger/ledger/fingerprint"
)

var jsonStructSeeds = []string{
	`{}`, `{"id":"re_123","amount":1250,"ok":true,"none":null}`,
	`{"a":{"b":[1,2.5,-0.001,{"c":null}],"d":[]},"e":{}}`,
	`{"x":1e308,"y":-0,"z":5e-324,"w":1e+21,"v":1.5e-7,"u":-12E3}`,
	`{"k~/":"v","":true}`, `{"€":"\u2028","q":"\"\\\/\b\f\n\r\t\u0000\u001f\u00e9"}`,
	` { "spaced" : [ 1 , 2 ] } `, `{"s":"\ud83d\ude00"}`, `{"lone":"\ud800"}`,
	`{"dup":1,"dup":2}`, `{"n":01}`, `{"n":1.}`, `{"n":.5}`, `{"n":1e}`, `{"n":1e400}`,
	`{"n":+1}`, `{"t":tru}`, `{"a":[1,]}`, `{"a":1,}`, `{"a":1} x`, `[1]`, `"s"`,
	"{\"bad\":\"\xff\"}", "{\"ctl\":\"a\x01b\"}", `{"esc":"\x"}`, `{"u":"\u12G4"}`,
	`{"a":` + strings.Repeat("[", 120) + strings.Repeat("]", 120) + `}`,
}

// TestParseJSONStruct: the direct parser reads what protojson reads, the same
// way, and refuses what protojson refuses.
func TestParseJSONStruct(t *testing.T) {
	for _, in := range jsonStructSeeds {
		checkJSONStruct(t, []byte(in))
	}
	// What it must take itself rather than leave to protojson: everything
	// fingerprint.Canonical writes.
	for _, in := range jsonStructSeeds[:6] {
		ref := &structpb.Struct{}
		if err := protojson.Unmarshal([]byte(in), ref); err != nil {
			t.Fatalf("seed %s: %v", in, err)
		}
		canon, err := fingerprint.Canonical(ref.AsMap())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parseJSONStruct(canon); err != nil {
			t.Errorf("canonical %s: %v", canon, err)
		}
	}
}

// FuzzParseJSONStruct: for any bytes, parseJSONStruct accepts only what
// protojson accepts, reads it into an equal Struct, and takes every
// canonical document itself.
func FuzzParseJSONStruct(f *testing.F) {
	for _, s := range jsonStructSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkJSONStruct(t, data)
	})
}

func checkJSONStruct(t *testing.T, data []byte) {
	t.Helper()
	got, err := parseJSONStruct(data)
	ref := &structpb.Struct{}
	refErr := protojson.Unmarshal(data, ref)
	if err == nil {
		if refErr != nil {
			t.Fatalf("parseJSONStruct took %q, protojson refuses it: %v", data, refErr)
		}
		if !proto.Equal(got, ref) {
			t.Fatalf("%q: parseJSONStruct %v, protojson %v", data, got, ref)
		}
	}
	viaResult, resErr := resultStruct(data)
	if (resErr == nil) != (refErr == nil) || resErr == nil && !proto.Equal(viaResult, ref) {
		t.Fatalf("%q: resultStruct %v (%v), protojson %v (%v)", data, viaResult, resErr, ref, refErr)
	}
	if refErr != nil {
		return
	}
	if canon, err := fingerprint.Canonical(ref.AsMap()); err == nil && bytes.Equal(canon, data) {
		if _, err := parseJSONStruct(data); err != nil {
			t.Fatalf("canonical %q left to protojson: %v", data, err)
		}
	}
}

// BenchmarkResultStruct: a replay's or a Lookup's 100-byte result, parsed
// directly and with protojson.
//
//	go test -run '^$' -bench ResultStruct -benchmem ./server
func BenchmarkResultStruct(b *testing.B) {
	data := []byte(`{"id":"` + strings.Repeat("r", 91) + `"}`)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := resultStruct(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protojson", func(b *testing.B) {
		for b.Loop() {
			if err := protojson.Unmarshal(data, &structpb.Struct{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
