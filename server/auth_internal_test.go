package server

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/url"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/opledger/ledger/internal/yamlnull/yamlnulltest"
	"github.com/opledger/ledger/ledger"
)

// credentialsExample is the credentials file of docs/configuration.md
// (section 4). The secrets are "password", "test" and "foo".
const credentialsExample = `keys:                                    # "authorization: Bearer <id>.<secret>"
  - id: acme-agent-1                     # letters, digits, - and _; unique
    tenant: acme
    scopes: [agent]                      # agent | reconciler | viewer
    secret_sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
  - id: acme-agent-0
    tenant: acme
    scopes: [agent]
    secret_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
    disabled: true                       # revoked
  - id: acme-ops
    tenant: acme
    scopes: [reconciler]
    secret_sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
clients:                                 # with --tls-client-ca: verified client certificates
  - {common_name: agent-7.acme.internal, tenant: acme, scopes: [agent]}
  - {uri: "spiffe://acme.example/reconciler", tenant: acme, scopes: [reconciler]}
tenants:                                 # optional overrides of --rate-limit, --rate-burst, --max-unresolved
  acme: {rate: 500, burst: 1000, max_unresolved: 50000}
`

// FuzzParseCredentials: a credentials file is accepted only when it is one
// YAML document whose every key id, tenant, scope, hash and limit is valid,
// and then, written back as a file, it parses to the same credentials; a
// refused file is refused with a message.
func FuzzParseCredentials(f *testing.F) {
	for _, doc := range []string{
		credentialsExample,
		`{"keys": [{"id": "k_1", "tenant": "t", "scopes": ["viewer", "agent"], "secret_sha256": "` + strings.Repeat("ab", 32) + `"}]}`,
		"keys: []\n",
		"tenants: {}\n",
		"tenants:\n  t1: {rate: 0.5, burst: 2, max_unresolved: 10}\n",
		"tenants:\n  t1: {rate: .nan}\n",
		"tenants:\n  t1: {rate: -1}\n",
		"keys:\n  - {id: a.b, tenant: t, scopes: [agent], secret_sha256: " + strings.Repeat("0", 64) + "}\n",
		"keys:\n  - {id: a, tenant: t, scopes: [admin], secret_sha256: " + strings.Repeat("0", 64) + "}\n",
		"keys:\n  - {id: a, tenant: t, scopes: [agent], secret_sha256: " + strings.Repeat("0", 63) + "}\n",
		"clients:\n  - {common_name: x, uri: y, tenant: t, scopes: [agent]}\n",
		"keys:\n  - {id: a, tenant: \"null\", scopes: [agent], secret_sha256: " + strings.Repeat("0", 64) + "}\n",
		"keys:\n  - {<<: &k {tenant: ~, scopes: [agent]}, id: a, tenant: t, secret_sha256: " + strings.Repeat("0", 64) + "}\n" +
			"  - {<<: *k, id: b, secret_sha256: " + strings.Repeat("0", 64) + "}\n",
		"tenants:\n  t1: &l {rate: 1}\n  <<: [{t2: *l}, {~: *l}]\n",
		"tenants: {a: {rate: 5, ~: 3}}\n",
		"~: 1\nkeys: []\n",
		"tenants:\n  \"<<\": {~: {rate: 5}}\n",
		"tenants:\n  \"<<\": {rate: 5}\n",
		"keys:\n  - {id: k1, ? : x, <<: {NULL: y}, tenant: t, scopes: [agent], secret_sha256: " + strings.Repeat("0", 64) + "}\n",
		"clients:\n  - {common_name: &t tenant, tenant: t, scopes: [agent], &n null: x}\n  - {uri: \"u:\", *t : *n, scopes: [agent]}\n",
		"",
	} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseCredentials(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused with an empty message")
			}
			return
		}
		if n := yamlDocuments(data); n != 1 {
			t.Fatalf("accepted a file of %d YAML documents", n)
		}
		checkCredentials(t, c)
		if line, ok := yamlnulltest.NullMappingKey(data); ok {
			t.Fatalf("accepted a file whose key on line %d reads as YAML's null (its entry dropped)", line)
		}
		if n, ok := tenantEntries(data); ok && n != len(c.tenants) {
			t.Fatalf("the file has %d tenants entries, the credentials %d", n, len(c.tenants))
		}
		again, err := ParseCredentials(writeCredentials(t, c))
		if err != nil {
			t.Fatalf("the parsed credentials written back do not parse: %v", err)
		}
		if !reflect.DeepEqual(again, c) {
			t.Fatalf("written back and parsed again: %+v, want %+v", again, c)
		}
	})
}

// yamlDocuments counts the YAML documents in data (-1 if it is not YAML).
func yamlDocuments(data []byte) int {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	n := 0
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return n
		} else if err != nil {
			return -1
		}
		n++
	}
}

// tenantEntries counts the entries of the file's tenants map (not ok when
// a merge key makes that uncertain).
func tenantEntries(data []byte) (int, bool) {
	var f struct{ Tenants yaml.Node }
	if err := yaml.Unmarshal(data, &f); err != nil {
		return 0, false
	}
	n := &f.Tenants
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return 0, true
	}
	for i := 0; i < len(n.Content); i += 2 {
		if n.Content[i].Tag == "!!merge" {
			return 0, false
		}
	}
	return len(n.Content) / 2, true
}

// checkCredentials fails t unless every entry of c is valid.
func checkCredentials(t *testing.T, c *Credentials) {
	t.Helper()
	checkScopes := func(where string, scopes []Scope) {
		if len(scopes) == 0 {
			t.Fatalf("%s: no scope", where)
		}
		for _, s := range scopes {
			if s != ScopeAgent && s != ScopeReconciler && s != ScopeViewer {
				t.Fatalf("%s: scope %q", where, s)
			}
		}
	}
	for id, k := range c.keys {
		if id != k.id || !keyIDPattern.MatchString(id) || len(k.hash) != 32 || ledger.ValidateTenant(k.tenant) != nil {
			t.Fatalf("key %q: %+v", id, k)
		}
		checkScopes(id, k.scopes)
	}
	for _, cl := range c.clients {
		if (cl.commonName == "") == (cl.uri == "") || ledger.ValidateTenant(cl.tenant) != nil {
			t.Fatalf("client %+v", cl)
		}
		checkScopes(cl.commonName+cl.uri, cl.scopes)
		// A certificate's URI is compared as url.URL.String gives it: any
		// other spelling would never match one.
		if u, err := url.Parse(cl.uri); cl.uri != "" && (err != nil || u.String() != cl.uri) {
			t.Fatalf("client uri %q is not in the form a certificate's URI is compared in", cl.uri)
		}
	}
	for name, lim := range c.tenants {
		if ledger.ValidateTenant(name) != nil || lim.Burst < 0 || lim.MaxUnresolved < 0 || !(lim.Rate >= 0) || math.IsInf(lim.Rate, 0) {
			t.Fatalf("tenant %q: %+v", name, lim)
		}
	}
}

// writeCredentials writes c as a credentials file (in JSON).
func writeCredentials(t *testing.T, c *Credentials) []byte {
	t.Helper()
	type key struct {
		ID           string  `json:"id"`
		Tenant       string  `json:"tenant"`
		Scopes       []Scope `json:"scopes"`
		SecretSHA256 string  `json:"secret_sha256"`
		Disabled     bool    `json:"disabled"`
	}
	type client struct {
		CommonName string  `json:"common_name,omitempty"`
		URI        string  `json:"uri,omitempty"`
		Tenant     string  `json:"tenant"`
		Scopes     []Scope `json:"scopes"`
	}
	type limits struct {
		Rate          float64 `json:"rate"`
		Burst         int     `json:"burst"`
		MaxUnresolved int     `json:"max_unresolved"`
	}
	var doc struct {
		Keys    []key             `json:"keys"`
		Clients []client          `json:"clients,omitempty"`
		Tenants map[string]limits `json:"tenants"` // null when nil, {} when empty
	}
	doc.Keys = []key{}
	for _, k := range c.keys {
		doc.Keys = append(doc.Keys, key{k.id, k.tenant, k.scopes, hex.EncodeToString(k.hash), k.disabled})
	}
	for _, cl := range c.clients {
		doc.Clients = append(doc.Clients, client{cl.commonName, cl.uri, cl.tenant, cl.scopes})
	}
	if c.tenants != nil {
		doc.Tenants = map[string]limits{}
		for name, lim := range c.tenants {
			doc.Tenants[name] = limits(lim)
		}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// keyIDPattern is the documented key id syntax.
var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// FuzzAuthenticate: the authorization header of a call is untrusted input.
// A key id is valid exactly when it has the documented syntax; a fresh key
// made for a valid id authenticates as that id; and any header either
// authenticates as the one enabled key whose "<id>.<secret>" it carries
// after "Bearer ", or is refused UNAUTHENTICATED with one of the fixed
// messages, which quote nothing from it.
func FuzzAuthenticate(f *testing.F) {
	for _, h := range []string{
		"Bearer acme-agent-1.password", "bearer acme-ops.foo", "BEARER  acme-ops.foo ", "Bearer acme-agent-0.test",
		"Bearer acme-agent-1.wrong", "Bearer acme-agent-1", "Bearer .password", "Basic acme-agent-1.password",
		"Bearer\tacme-agent-1.password", "acme-agent-1.password", "Bearer acme-agent-1.password.x", "",
	} {
		f.Add("k_1", h)
	}
	f.Add(strings.Repeat("a", 65), "Bearer x.y")
	f.Add("a.b", "Bearer a.b.c")
	base, err := ParseCredentials([]byte(credentialsExample))
	if err != nil {
		f.Fatal(err)
	}
	secrets := map[string]string{"acme-agent-1": "password", "acme-agent-0": "test", "acme-ops": "foo"}
	f.Fuzz(func(t *testing.T, id, header string) {
		valid := validKeyID(id)
		if valid != keyIDPattern.MatchString(id) {
			t.Fatalf("validKeyID(%q) = %v", id, valid)
		}
		key, hash, err := NewAPIKey(id)
		if (err == nil) != valid {
			t.Fatalf("NewAPIKey(%q): %v", id, err)
		}
		creds := base
		if valid && secrets[id] == "" {
			// The example, and the fresh key.
			quoted, _ := json.Marshal(id)
			doc := strings.Replace(credentialsExample, "keys:", "keys:\n  - {id: "+string(quoted)+", tenant: fresh, scopes: [viewer], secret_sha256: "+hash+"}", 1)
			if creds, err = ParseCredentials([]byte(doc)); err != nil {
				t.Fatalf("a fresh key for %q: %v", id, err)
			}
			p, err := NewAuthenticator(creds).authenticate(incoming("Bearer " + key))
			if err != nil || p.ID != id || p.Tenant != "fresh" || !reflect.DeepEqual(p.scopes, []Scope{ScopeViewer}) {
				t.Fatalf("fresh key for %q: %+v, %v", id, p, err)
			}
			secrets[id] = strings.TrimPrefix(key, id+".")
			defer delete(secrets, id)
		}
		p, err := NewAuthenticator(creds).authenticate(incoming(header))
		scheme, token, _ := strings.Cut(header, " ")
		token = strings.TrimSpace(token)
		if err == nil {
			secret, ok := secrets[p.ID]
			if !ok || p.ID == "acme-agent-0" || !strings.EqualFold(scheme, "bearer") || token != p.ID+"."+secret {
				t.Fatalf("header %q authenticates as %+v", header, p)
			}
			return
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("header %q: %v", header, err)
		}
		switch msg := status.Convert(err).Message(); msg {
		case "the authorization header must be \"Bearer <key>\"", "invalid or revoked API key":
		default:
			t.Fatalf("header %q: the error %q is not one that quotes nothing", header, msg)
		}
		for kid, secret := range secrets {
			if kid != "acme-agent-0" && strings.EqualFold(scheme, "bearer") && token == kid+"."+secret {
				t.Fatalf("header %q of key %s refused: %v", header, kid, err)
			}
		}
	})
}

// incoming is a call's context whose metadata holds the authorization
// header h.
func incoming(h string) context.Context {
	return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", h))
}
