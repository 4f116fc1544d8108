package receipt

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/ledger"
)

func signer(t *testing.T, kids ...string) (*Signer, []*Key) {
	t.Helper()
	var keys []*Key
	for _, kid := range kids {
		k, err := NewKey(kid)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	s, err := NewSigner("ledgerd-test", keys)
	if err != nil {
		t.Fatal(err)
	}
	return s, keys
}

var claims = Claims{Tenant: "acme", OperationID: "wf-1:refund", Tool: "payments.refund", ParamsSHA256: strings.Repeat("ab", 32),
	PermitID: "p-1", State: "STATE_SUCCEEDED", Attempt: 1, FencingToken: "1796182678559", ResultSHA256: strings.Repeat("cd", 32),
	ResourceID: "re_1"}

// TestSignAndVerify: a receipt verifies with the issuer's key set, and
// every change to it, or another key set, is refused.
func TestSignAndVerify(t *testing.T) {
	s, _ := signer(t, "k-2026")
	jws, err := s.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Verify(jws, s.JWKS())
	if err != nil {
		t.Fatal(err)
	}
	want := claims
	want.Version, want.Issuer, want.IssuedAt = Version, "ledgerd-test", got.IssuedAt
	if *got != want || got.IssuedAt == "" {
		t.Fatalf("claims %+v, want %+v", got, want)
	}
	parts := strings.Split(jws, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	other, _ := signer(t, "k-2026")
	tampered := strings.Replace(string(payload), `"re_1"`, `"re_2"`, 1)
	for name, c := range map[string]struct {
		jws string
		set func() any
	}{
		"a changed payload":       {parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(tampered)) + "." + parts[2], nil},
		"another key, same kid":   {jws, func() any { return other }},
		"a cut signature":         {parts[0] + "." + parts[1] + "." + parts[2][:10], nil},
		"not a JWS":               {"receipt", nil},
		"a payload not canonical": {resign(t, s, `{"v":1, "tenant":"acme"}`), nil},
	} {
		set := s.JWKS()
		if c.set != nil {
			set = other.JWKS()
		}
		if _, err := Verify(c.jws, set); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
}

// resign signs raw bytes with s's key as a receipt would be.
func resign(t *testing.T, s *Signer, payload string) string {
	t.Helper()
	jws, err := s.signer.Sign([]byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRotation: after a rotation the new key signs and the previous one,
// kept in the set, still verifies what it signed.
func TestRotation(t *testing.T) {
	old, oldKeys := signer(t, "k-old")
	before, err := old.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := NewKey("k-new")
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := NewSigner("ledgerd-test", []*Key{newKey, {ID: "k-old", Public: oldKeys[0].Public}})
	if err != nil {
		t.Fatal(err)
	}
	after, err := rotated.Sign(claims)
	if err != nil {
		t.Fatal(err)
	}
	for _, jws := range []string{before, after} {
		if _, err := Verify(jws, rotated.JWKS()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Verify(after, old.JWKS()); err == nil {
		t.Fatal("the new key's receipt verified with the old set")
	}
}

// TestKeyFiles: a key written as a JWK loads back; the files LoadKeys
// refuses say why.
func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, k *Key, public bool) string {
		if public {
			k = &Key{ID: k.ID, Public: k.Public}
		}
		b, err := k.MarshalJWK()
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, _ := NewKey("a")
	b, _ := NewKey("b")
	keys, err := LoadKeys([]string{write("a.jwk", a, false), write("b.jwk", b, true)})
	if err != nil || len(keys) != 2 || !keys[0].Private.Equal(a.Private) || keys[1].Private != nil {
		t.Fatalf("LoadKeys = %v, %v", keys, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rsa.jwk"), []byte(`{"kty":"oct","k":"c2VjcmV0","kid":"x"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	noKid, _ := json.Marshal(map[string]string{"kty": "OKP", "crv": "Ed25519", "x": base64.RawURLEncoding.EncodeToString(a.Public)})
	if err := os.WriteFile(filepath.Join(dir, "nokid.jwk"), noKid, 0o600); err != nil {
		t.Fatal(err)
	}
	set, _ := json.Marshal(JWKS([]*Key{a}))
	if err := os.WriteFile(filepath.Join(dir, "set.jwk"), set, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		paths []string
		want  string
	}{
		{[]string{write("pub.jwk", a, true)}, "needs its private part"},
		{[]string{filepath.Join(dir, "a.jwk"), filepath.Join(dir, "a.jwk")}, "appears twice"},
		{[]string{filepath.Join(dir, "rsa.jwk")}, "not an Ed25519 key"},
		{[]string{filepath.Join(dir, "nokid.jwk")}, "no key id"},
		{[]string{filepath.Join(dir, "missing.jwk")}, "no such file"},
		{[]string{filepath.Join(dir, "set.jwk")}, "a JWK Set, not one key: give each key's own file (ledgerd keygen --receipts writes one)"},
		{nil, "no receipt keys"},
	} {
		if _, err := LoadKeys(c.paths); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("LoadKeys(%v) = %v, want %q", c.paths, err, c.want)
		}
	}
}

// TestResultSHA256: the digest is that of the canonical JSON of
// {"data", "resource_id"}, whatever the order of the data's keys; data as
// deep as a fingerprint takes has one, deeper data and other JSON none.
func TestResultSHA256(t *testing.T) {
	nested := func(depth int) string {
		return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
	}
	wrapped := func(data any, id string) string {
		c, err := fingerprint.Canonical(map[string]any{"data": data, "resource_id": id})
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(c)
		return hex.EncodeToString(sum[:])
	}
	cases := []struct {
		name, data, id string
		want           string // "" for an error
	}{
		{"keys in order", `{"a":"x","b":1}`, "re_1", wrapped(map[string]any{"a": "x", "b": 1.0}, "re_1")},
		{"keys out of order", `{"b":1,"a":"x"}`, "re_1", wrapped(map[string]any{"a": "x", "b": 1.0}, "re_1")},
		{"another id", `{"a":"x","b":1}`, "re_\u2028\"2", wrapped(map[string]any{"a": "x", "b": 1.0}, "re_\u2028\"2")},
		{"no data", "", "", wrapped(map[string]any{}, "")},
		{"as deep as a fingerprint takes", nested(fingerprint.MaxDepth), "re_deep", "set"},
		{"deeper", nested(fingerprint.MaxDepth + 1), "re_deep", ""},
		{"not JSON", `{"a":`, "re_1", ""},
		{"an id that is not UTF-8", `{}`, "re_\xff", ""},
	}
	seen := map[string]string{}
	for _, c := range cases {
		got, err := ResultSHA256([]byte(c.data), c.id)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: %s, want an error", c.name, got)
		case c.want != "" && (err != nil || len(got) != 64):
			t.Errorf("%s: %q, %v", c.name, got, err)
		case c.want != "set" && c.want != "" && got != c.want:
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
		if other, dup := seen[got]; dup && got != "" && c.name != "keys out of order" {
			t.Errorf("%s: the digest of %s", c.name, other)
		}
		seen[got] = c.name
	}
}

// FuzzResultSHA256: every result the ledger takes (result data a JSON
// object with a canonical form, a resource id it accepts) has a digest,
// and where fingerprint.Canonical takes the object around them, it is the
// digest of that object's canonical JSON.
func FuzzResultSHA256(f *testing.F) {
	f.Add(`{"b":1,"a":"x"}`, "re_1")
	f.Add(strings.Repeat(`{"a":`, fingerprint.MaxDepth)+"1"+strings.Repeat("}", fingerprint.MaxDepth), "re_deep")
	f.Add(`{"n":1e21,"s":"\u2028"}`, "")
	f.Fuzz(func(t *testing.T, data, id string) {
		var v any
		if json.Unmarshal([]byte(data), &v) != nil || ledger.ValidateResourceID(id) != nil {
			return
		}
		if _, ok := v.(map[string]any); !ok {
			return
		}
		if _, err := fingerprint.Canonical(v); err != nil {
			return // the ledger refuses it
		}
		got, err := ResultSHA256([]byte(data), id)
		if err != nil {
			t.Fatalf("ResultSHA256(%q, %q): %v", data, id, err)
		}
		if c, err := fingerprint.Canonical(map[string]any{"data": v, "resource_id": id}); err == nil {
			if sum := sha256.Sum256(c); got != hex.EncodeToString(sum[:]) {
				t.Fatalf("ResultSHA256(%q, %q) = %s, not the digest of %s", data, id, got, c)
			}
		}
	})
}

// FuzzVerify: any input, a receipt or not, is verified or refused without
// a panic; claims come back only for what the key signed, and a receipt
// changed in any byte of its payload or signature never verifies.
func FuzzVerify(f *testing.F) {
	key, err := NewKey("k-fuzz")
	if err != nil {
		f.Fatal(err)
	}
	s, err := NewSigner("fuzz", []*Key{key})
	if err != nil {
		f.Fatal(err)
	}
	jws, err := s.Sign(claims)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(jws, 0, byte(0))
	f.Add("e30.e30.e30", 3, byte(1))
	f.Add("", 0, byte(0))
	f.Fuzz(func(t *testing.T, input string, at int, flip byte) {
		if _, err := Verify(input, s.JWKS()); err == nil && input != jws {
			t.Fatalf("verified an input that is not the receipt: %q", input)
		}
		head := strings.IndexByte(jws, '.') + 1 // the header is not changed here: only payload and signature
		if flip == 0 || at < 0 {
			return
		}
		i := head + at%(len(jws)-head)
		b := []byte(jws)
		b[i] ^= flip
		if sameBytes(string(b), jws) {
			return // base64 may spell the same bytes two ways (the unused bits of its last character)
		}
		if c, err := Verify(string(b), s.JWKS()); err == nil {
			t.Fatalf("a receipt changed at byte %d verified: %+v", i, c)
		}
	})
}

// FuzzParseJWK: a key file is parsed or refused without a panic; what
// parses is an Ed25519 key with a key id.
func FuzzParseJWK(f *testing.F) {
	k, _ := NewKey("k-1")
	b, _ := k.MarshalJWK()
	f.Add(b)
	f.Add([]byte(`{"kty":"OKP","crv":"Ed25519","x":"","kid":"a"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		key, err := ParseJWK(data)
		if err == nil && (key.ID == "" || len(key.Public) != 32) {
			t.Fatalf("parsed %q into %+v", data, key)
		}
	})
}

// sameBytes reports whether two compact JWS decode to the same parts.
func sameBytes(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	if len(pa) != len(pb) {
		return false
	}
	for i := range pa {
		da, ea := base64.RawURLEncoding.DecodeString(pa[i])
		db, eb := base64.RawURLEncoding.DecodeString(pb[i])
		if ea != nil || eb != nil || string(da) != string(db) {
			return false
		}
	}
	return true
}

// TestClaimsObject: the object Sign signs is the claims' JSON, names and
// omissions included, with every field set and with the optional ones left
// out.
func TestClaimsObject(t *testing.T) {
	full := Claims{Version: 1, Issuer: "i", IssuedAt: "t", Tenant: "te", OperationID: "o", Tool: "to", ParamsSHA256: "p",
		PermitID: "pe", State: "s", Attempt: 4294967295, FencingToken: "f", ResultSHA256: "r", ResourceID: "re",
		FailureCode: "fc", FailureDetailSHA256: "fd", HistoryHead: "h", Refused: "rf", Differs: "d"}
	for _, c := range []Claims{full, {Version: 1, State: "STATE_UNKNOWN"}} {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		got, err1 := fingerprint.Canonical(c.object())
		canon, err2 := fingerprint.Canonical(want)
		if err1 != nil || err2 != nil || string(got) != string(canon) {
			t.Errorf("object of %+v = %s, want %s (%v, %v)", c, got, canon, err1, err2)
		}
	}
}

// BenchmarkSign is one receipt of a SUCCEEDED operation: the canonical JSON
// of its claims and the Ed25519 signature (docs/benchmarks.md §10).
func BenchmarkSign(b *testing.B) {
	k, err := NewKey("k")
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewSigner("bench", []*Key{k})
	if err != nil {
		b.Fatal(err)
	}
	c := Claims{Tenant: "default", OperationID: "bench-00000001:op", Tool: "payments.refund",
		ParamsSHA256: strings.Repeat("8c", 32), PermitID: "permit-1", State: "STATE_SUCCEEDED", Attempt: 1,
		FencingToken: "1796191442214", ResultSHA256: strings.Repeat("54", 32), ResourceID: "re_1", HistoryHead: strings.Repeat("57", 20)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sign(c); err != nil {
			b.Fatal(err)
		}
	}
}
