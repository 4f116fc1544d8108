package ledger

import (
	"hash/fnv"
	"os"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// hashTag returns what Redis Cluster hashes for key: the text between the
// first '{' and the next '}', when not empty; otherwise the whole key.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

func checkKeys(t *testing.T, tenant, id string) {
	ks := newKeyspace(DefaultPrefix)
	k := ks.op(tenant, id)
	tag := hashTag(k.all[0])
	if !strings.HasPrefix(tag, "s") || len(tag) != 3 {
		t.Fatalf("hash tag %q of %q", tag, k.all[0])
	}
	for _, key := range k.all {
		if hashTag(key) != tag {
			t.Fatalf("key %q is in another slot than %q", key, k.all[0])
		}
		if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 {
			t.Fatalf("key %q holds a brace of the input", key)
		}
	}
	// The tenant and id segments cannot run into each other.
	rest := strings.TrimPrefix(k.all[0], ks.tag(k.shard)+":op:")
	if strings.Count(rest, ":") != 1 {
		t.Fatalf("record key %q: encoded tenant or id holds ':'", k.all[0])
	}
	// The shard is FNV-1a of "<tenant>:<id>" encoded, as hash/fnv computes
	// it: part of the key layout.
	et, ei := encodeComponent(tenant), encodeComponent(id)
	h := fnv.New32a()
	h.Write([]byte(et + ":" + ei))
	if want := int(h.Sum32() % NumShards); k.shard != want || ks.run(tenant, id).shard != want {
		t.Fatalf("shard of (%q, %q) = %d (run %d), want %d", tenant, id, k.shard, ks.run(tenant, id).shard, want)
	}
	if k.member != et+":"+ei || k.all[0] != ks.tag(k.shard)+":op:"+k.member || k.all[1] != ks.tag(k.shard)+":unresolved:"+et {
		t.Fatalf("keys of (%q, %q): %q, member %q", tenant, id, k.all, k.member)
	}
	back, err := ks.opFromLeaseMember(k.member)
	if err != nil || back.tenant != tenant || back.id != id {
		t.Fatalf("lease member %q decodes to (%q, %q, %v)", k.member, back.tenant, back.id, err)
	}
}

func TestKeysStayInOneSlotAndTenant(t *testing.T) {
	cases := [][2]string{
		{"default", "wf-8472:create-ticket"},
		{"default", "{s01}"},
		{"default", "a}{b"},
		{"a:b", "c"},
		{"a", "b:c"},
		{"default", "*"},
		{"default", "%41"},
		{"default", "line\nbreak\x00nul"},
		{"default", "\xff\xfe invalid utf-8"},
		{"default", strings.Repeat("x", 10<<10)},
		{"t%3A", "x"},
	}
	seen := map[string][2]string{}
	for _, c := range cases {
		checkKeys(t, c[0], c[1])
		key := newKeyspace(DefaultPrefix).op(c[0], c[1]).all[0]
		if prev, ok := seen[key]; ok {
			t.Fatalf("%q and %q share the key %q", prev, c, key)
		}
		seen[key] = c
	}
}

func TestShardsSpread(t *testing.T) {
	used := map[int]bool{}
	for i := range 2000 {
		used[shardOf("default", "op-"+itoa(int64(i)))] = true
	}
	if len(used) != NumShards {
		t.Fatalf("2000 operations of one tenant use %d of %d shards", len(used), NumShards)
	}
}

// BenchmarkOpKeys measures building the keys of one operation:
//
//	go test -run '^$' -bench OpKeys -benchmem ./ledger
func BenchmarkOpKeys(b *testing.B) {
	ks := newKeyspace(DefaultPrefix)
	for b.Loop() {
		_ = ks.op("default", "wf-0000000042:refund")
	}
}

func TestDecodeComponentRefusesForeignInput(t *testing.T) {
	for _, s := range []string{"a:b", "%4", "%zz", "%41", "a{b", "%"} {
		if _, err := decodeComponent(s); err == nil {
			t.Errorf("decodeComponent(%q) accepted it", s)
		}
	}
}

// FuzzKeyEncoding: whatever bytes a tenant or id holds, its keys stay in one
// slot, never borrow a brace or a separator from the input, and decode back
// to exactly the input; distinct inputs get distinct keys.
func FuzzKeyEncoding(f *testing.F) {
	for _, s := range []string{"", "a", "{", "}", ":", "{a}:b", "%", "%25", "\x00", "\n", "\xff", "é", "*?[]"} {
		f.Add("default", s)
		f.Add(s, "op")
	}
	f.Fuzz(func(t *testing.T, tenant, id string) {
		checkKeys(t, tenant, id)
		enc := encodeComponent(id)
		if dec, err := decodeComponent(enc); err != nil || dec != id {
			t.Fatalf("round trip of %q: %q, %v", id, dec, err)
		}
		ks := newKeyspace(DefaultPrefix)
		if id != tenant && ks.op(tenant, id).all[0] == ks.op(id, tenant).all[0] {
			t.Fatalf("(%q, %q) and (%q, %q) share a key", tenant, id, id, tenant)
		}
	})
}

// FuzzValidateID: the id validation never panics, and what it accepts is
// non-empty, at most MaxOperationIDLen bytes of valid UTF-8 without control
// characters. A resource id follows the same rules, and may be empty.
func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"wf-8472:create-ticket", "", "a\nb", "a\x00b", "\xff", "{x}", "*", strings.Repeat("a", 257), "é", "\u2028", "\u0085"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := ValidateOperationID(id)
		if rerr := ValidateResourceID(id); (rerr == nil) != (err == nil || id == "") || rerr != nil && KindOf(rerr) != KindInvalid {
			t.Fatalf("resource id %q: %v, operation id: %v", id, rerr, err)
		}
		if err != nil {
			if KindOf(err) != KindInvalid {
				t.Fatalf("kind %v", KindOf(err))
			}
			if strings.Contains(err.Error(), id) && id != "" && len(id) > 3 {
				// The message names the field, never echoes the value.
				t.Fatalf("error %q echoes the id", err)
			}
			return
		}
		if id == "" || len(id) > MaxOperationIDLen || !utf8.ValidString(id) {
			t.Fatalf("accepted %q", id)
		}
		for _, r := range id {
			if unicode.IsControl(r) {
				t.Fatalf("accepted a control character in %q", id)
			}
		}
	})
}

func TestSecurityDocShowsTheACL(t *testing.T) {
	doc, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ name, rules string }{
		{"ACLRules", ACLRules(DefaultPrefix)},
		{"ClusterACLRules", ClusterACLRules(DefaultPrefix)},
		{"SentinelACLRules", SentinelACLRules()},
	} {
		if !strings.Contains(string(doc), "ACL SETUSER ledger on >PASSWORD "+r.rules+"\n") {
			t.Errorf("docs/security.md does not show the rules of %s:\n%s", r.name, r.rules)
		}
	}
}
