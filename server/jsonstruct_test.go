package server

import (
	"bytes"
	"strings"
	"testing"

	ledgerv1 "github.com/opledger/ledger/gen/ledger/v1"
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
	`{"b":1,"a":2}`, `{"😀":1,"":2}`, `{"":1,"😀":2}`, `{"a":{"y":1,"x":2}}`,
}

// TestWriteJSONStruct: the direct writer reads what protojson reads, the
// same way, and refuses what protojson refuses.
func TestWriteJSONStruct(t *testing.T) {
	for _, in := range jsonStructSeeds {
		checkJSONStruct(t, []byte(in))
	}
	// What it must take itself rather than leave to protojson: everything
	// fingerprint.Canonical writes.
	for _, in := range jsonStructSeeds[:7] {
		ref := &structpb.Struct{}
		if err := protojson.Unmarshal([]byte(in), ref); err != nil {
			t.Fatalf("seed %s: %v", in, err)
		}
		canon, err := fingerprint.Canonical(ref.AsMap())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := writeJSONStruct(nil, canon); err != nil {
			t.Errorf("canonical %s: %v", canon, err)
		}
	}
}

// FuzzWriteJSONStruct: for any bytes, writeJSONStruct accepts only what
// protojson accepts, writes it as an equal Struct, and takes every
// canonical document itself.
func FuzzWriteJSONStruct(f *testing.F) {
	for _, s := range jsonStructSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkJSONStruct(t, data)
	})
}

// resultData decodes the wire bytes of a Result's data field.
func resultData(t *testing.T, wire []byte) *structpb.Struct {
	t.Helper()
	var r ledgerv1.Result
	if err := proto.Unmarshal(wire, &r); err != nil || r.GetData() == nil || len(r.ProtoReflect().GetUnknown()) > 0 {
		t.Fatalf("%x: no Result with data only (%v)", wire, err)
	}
	return r.GetData()
}

func checkJSONStruct(t *testing.T, data []byte) {
	t.Helper()
	got, err := writeJSONStruct(nil, data)
	ref := &structpb.Struct{}
	refErr := protojson.Unmarshal(data, ref)
	if err == nil {
		if refErr != nil {
			t.Fatalf("writeJSONStruct took %q, protojson refuses it: %v", data, refErr)
		}
		if s := resultData(t, got); !proto.Equal(s, ref) {
			t.Fatalf("%q: writeJSONStruct %v, protojson %v", data, s, ref)
		}
	}
	prefix := []byte("prefix")
	viaResult, resErr := appendResultData(prefix, data)
	if (resErr == nil) != (refErr == nil) || !bytes.HasPrefix(viaResult, prefix) || resErr != nil && len(viaResult) != len(prefix) {
		t.Fatalf("%q: appendResultData %x (%v), protojson %v", data, viaResult, resErr, refErr)
	}
	if refErr != nil {
		return
	}
	if s := resultData(t, viaResult[len(prefix):]); !proto.Equal(s, ref) {
		t.Fatalf("%q: appendResultData %v, protojson %v", data, s, ref)
	}
	if canon, err := fingerprint.Canonical(ref.AsMap()); err == nil && bytes.Equal(canon, data) {
		if _, err := writeJSONStruct(nil, data); err != nil {
			t.Fatalf("canonical %q left to protojson: %v", data, err)
		}
	}
}

// BenchmarkResultData: a replay's or a Lookup's 100-byte result, written
// to the wire directly, and by protojson and proto.Marshal.
//
//	go test -run '^$' -bench ResultData -benchmem ./server
func BenchmarkResultData(b *testing.B) {
	data := []byte(`{"id":"` + strings.Repeat("r", 91) + `"}`)
	buf := make([]byte, 0, 256)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if _, err := appendResultData(buf, data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("protojson", func(b *testing.B) {
		for b.Loop() {
			s := &structpb.Struct{}
			if err := protojson.Unmarshal(data, s); err != nil {
				b.Fatal(err)
			}
			if _, err := proto.Marshal(&ledgerv1.Result{Data: s}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
