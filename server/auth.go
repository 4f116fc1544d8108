package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/opledger/ledger/internal/yamlerr"
	"github.com/opledger/ledger/internal/yamlnull"
	"github.com/opledger/ledger/ledger"
)

// Scope is a set of methods a credential may call.
type Scope string

// The scopes (contract.md §8).
const (
	// ScopeAgent: Reserve, Complete, MarkUnknown, Renew, Lookup, StartRun,
	// GetRun, EndRun.
	ScopeAgent Scope = "agent"
	// ScopeReconciler: the agent's methods, Reconcile, ListUnresolved and
	// ListRuns.
	ScopeReconciler Scope = "reconciler"
	// ScopeViewer: Lookup, ListUnresolved, GetRun and ListRuns.
	ScopeViewer Scope = "viewer"
)

// methodScopes says which scopes may call each ledger method.
var methodScopes = map[string][]Scope{
	"Reserve":        {ScopeAgent, ScopeReconciler},
	"Complete":       {ScopeAgent, ScopeReconciler},
	"MarkUnknown":    {ScopeAgent, ScopeReconciler},
	"Renew":          {ScopeAgent, ScopeReconciler},
	"Lookup":         {ScopeAgent, ScopeReconciler, ScopeViewer},
	"Reconcile":      {ScopeReconciler},
	"ListUnresolved": {ScopeReconciler, ScopeViewer},
	"StartRun":       {ScopeAgent, ScopeReconciler},
	"GetRun":         {ScopeAgent, ScopeReconciler, ScopeViewer},
	"EndRun":         {ScopeAgent, ScopeReconciler},
	"ListRuns":       {ScopeReconciler, ScopeViewer},
	"GetCaller":      {ScopeAgent, ScopeReconciler, ScopeViewer},
}

// Credentials are what callers authenticate with, loaded from the
// credentials file (see ParseCredentials).
type Credentials struct {
	keys    map[string]apiKey // by key id
	clients []clientCert
	tenants map[string]TenantLimits
}

type apiKey struct {
	id, tenant string
	scopes     []Scope
	hash       []byte // SHA-256 of the secret
	disabled   bool
}

type clientCert struct {
	commonName, uri string
	tenant          string
	scopes          []Scope
}

// TenantLimits are a tenant's overrides of the service-wide limits. Each
// field that is zero is the service-wide value, on its own: a tenant may set
// its rate and keep the service's burst, or the reverse. A burst that is zero
// in both is the tenant's rate (its own or the service's), rounded up, as
// for the service.
type TenantLimits struct {
	// Rate is how many calls per second the tenant may make.
	Rate float64 `yaml:"rate"`
	// Burst is how many calls it may make at once.
	Burst int `yaml:"burst"`
	// MaxUnresolved is how many unresolved operations it may hold.
	MaxUnresolved int `yaml:"max_unresolved"`
}

type credentialsFile struct {
	Keys    []keyEntry              `yaml:"keys"`
	Clients []clientEntry           `yaml:"clients"`
	Tenants map[string]TenantLimits `yaml:"tenants"`
}

// keyEntry is an API key as the credentials file lists it.
type keyEntry struct {
	ID           string   `yaml:"id"`
	Tenant       string   `yaml:"tenant"`
	Scopes       []string `yaml:"scopes"`
	SecretSHA256 string   `yaml:"secret_sha256"`
	Disabled     bool     `yaml:"disabled"`
}

// clientEntry is a client certificate as the credentials file lists it.
type clientEntry struct {
	CommonName string   `yaml:"common_name"`
	URI        string   `yaml:"uri"`
	Tenant     string   `yaml:"tenant"`
	Scopes     []string `yaml:"scopes"`
}

// LoadCredentials reads a credentials file.
func LoadCredentials(file string) (*Credentials, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("credentials file: %w", err)
	}
	c, err := ParseCredentials(data)
	if err != nil {
		return nil, fmt.Errorf("credentials file %s: %w", file, err)
	}
	return c, nil
}

// ParseCredentials parses a credentials document (YAML or JSON):
//
//	keys:                              # API keys, sent as "authorization: Bearer <id>.<secret>"
//	  - id: acme-agent-1               # letters, digits, '-' and '_'; unique
//	    tenant: acme
//	    scopes: [agent]                # agent, reconciler, viewer
//	    secret_sha256: 5e88...         # hex SHA-256 of the secret (never the secret)
//	    disabled: false                # true revokes the key
//	clients:                           # with mTLS: verified client certificates
//	  - common_name: agent-1.acme.internal   # or uri: spiffe://acme.example/agent
//	    tenant: acme
//	    scopes: [agent]
//	tenants:                           # optional per-tenant limits
//	  acme: {rate: 500, burst: 1000, max_unresolved: 50000}
//
// Unknown fields, duplicate key ids, unknown scopes, malformed hashes, a
// tenant written as YAML's null (unquoted null or ~, as a key's or client's
// tenant or a name under tenants, also through a merge key), any other
// mapping key YAML reads as null (whose entry decoding would drop) and a
// second YAML document are errors. A quoted "<<" is a name, not a merge key.
func ParseCredentials(data []byte) (*Credentials, error) {
	f, err := decodeCredentials(data)
	if err != nil {
		return nil, err
	}
	nulls := nullTenants(data)
	c := &Credentials{keys: map[string]apiKey{}, tenants: f.Tenants}
	for i, k := range f.Keys {
		key, err := parseKey(fmt.Sprintf("keys[%d]", i), k, nulls)
		if err != nil {
			return nil, err
		}
		if _, dup := c.keys[k.ID]; dup {
			return nil, fmt.Errorf("keys[%d]: id %q is listed twice", i, k.ID)
		}
		c.keys[k.ID] = key
	}
	for i, cl := range f.Clients {
		cc, err := parseClient(fmt.Sprintf("clients[%d]", i), cl, nulls)
		if err != nil {
			return nil, err
		}
		c.clients = append(c.clients, cc)
	}
	if err := checkTenantLimits(f.Tenants); err != nil {
		return nil, err
	}
	return c, nil
}

// decodeCredentials decodes the one YAML document of data, refusing
// unknown fields and mapping keys that read as null.
func decodeCredentials(data []byte) (credentialsFile, error) {
	var f credentialsFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); errors.Is(err, io.EOF) {
		return f, errors.New("the credentials file is empty: it needs a YAML document with the keys (docs/security.md)")
	} else if err != nil {
		return f, fmt.Errorf("not a valid credentials document: %w", yamlerr.Readable(err, data))
	}
	// What follows the document would otherwise go unread: a key revoked
	// there, or text that is no YAML at all.
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return f, errors.New("the credentials file must hold exactly one YAML document")
	}
	return f, refuseNullKeys(data)
}

// parseKey checks the API key k, the entry at where, against the tenants
// that read as null (nulls, from nullTenants).
func parseKey(where string, k keyEntry, nulls map[string]string) (apiKey, error) {
	if !validKeyID(k.ID) {
		if id, _, ok := strings.Cut(k.ID, "."); ok {
			// The whole key ("<id>.<secret>") written as its id: the
			// error, which goes to stderr or the log, must not quote the
			// secret.
			return apiKey{}, fmt.Errorf("%s: id %q followed by '.' and more: a key id has no '.'; write the id of the key (\"<id>.<secret>\") only, never its secret (the file holds the secret's SHA-256, secret_sha256)", where, id)
		}
		return apiKey{}, fmt.Errorf("%s: id %q: want 1 to 64 letters, digits, '-' or '_'", where, k.ID)
	}
	if v, ok := nulls[where]; ok && k.Tenant == "" {
		return apiKey{}, fmt.Errorf("%s (%s): tenant %q reads as YAML's null, not a name: quote it if that is the tenant's name", where, k.ID, v)
	}
	if err := ledger.ValidateTenant(k.Tenant); err != nil {
		return apiKey{}, fmt.Errorf("%s (%s): tenant: %w", where, k.ID, err)
	}
	scopes, err := parseScopes(k.Scopes)
	if err != nil {
		return apiKey{}, fmt.Errorf("%s (%s): %w", where, k.ID, err)
	}
	hash, err := hex.DecodeString(k.SecretSHA256)
	if err != nil || len(hash) != sha256.Size {
		return apiKey{}, fmt.Errorf("%s (%s): secret_sha256: want 64 hex digits", where, k.ID)
	}
	return apiKey{id: k.ID, tenant: k.Tenant, scopes: scopes, hash: hash, disabled: k.Disabled}, nil
}

// parseClient checks the client certificate cl, the entry at where, as
// parseKey does a key.
func parseClient(where string, cl clientEntry, nulls map[string]string) (clientCert, error) {
	if (cl.CommonName == "") == (cl.URI == "") {
		return clientCert{}, fmt.Errorf("%s: set exactly one of common_name and uri", where)
	}
	if cl.URI != "" {
		// A certificate's URI is compared as url.URL.String writes it
		// (authenticate): another spelling would match no certificate.
		u, err := url.Parse(cl.URI)
		if err != nil {
			return clientCert{}, fmt.Errorf("%s: uri %q: not a URI", where, cl.URI)
		}
		if u.String() != cl.URI {
			return clientCert{}, fmt.Errorf("%s: uri %q: write it as %q, the form a certificate's URI is compared in", where, cl.URI, u.String())
		}
	}
	if v, ok := nulls[where]; ok && cl.Tenant == "" {
		return clientCert{}, fmt.Errorf("%s: tenant %q reads as YAML's null, not a name: quote it if that is the tenant's name", where, v)
	}
	if err := ledger.ValidateTenant(cl.Tenant); err != nil {
		return clientCert{}, fmt.Errorf("%s: tenant: %w", where, err)
	}
	scopes, err := parseScopes(cl.Scopes)
	if err != nil {
		return clientCert{}, fmt.Errorf("%s: %w", where, err)
	}
	return clientCert{commonName: cl.CommonName, uri: cl.URI, tenant: cl.Tenant, scopes: scopes}, nil
}

// checkTenantLimits checks the names and limits under tenants, in name
// order, so that of two bad tenants the same one is named.
func checkTenantLimits(tenants map[string]TenantLimits) error {
	for _, t := range slices.Sorted(maps.Keys(tenants)) {
		lim := tenants[t]
		if err := ledger.ValidateTenant(t); err != nil {
			return fmt.Errorf("tenants[%q]: %w", t, err)
		}
		if lim.Burst < 0 || lim.MaxUnresolved < 0 {
			return fmt.Errorf("tenants[%q]: limits must not be negative", t)
		}
		if !(lim.Rate >= 0) || math.IsInf(lim.Rate, 0) {
			return fmt.Errorf("tenants[%q]: rate: want a finite number of calls per second, not negative", t)
		}
	}
	return nil
}

// refuseNullKeys returns an error naming the first mapping key in the
// credentials document data (decoded already) that YAML reads as null
// (yamlnull.Find), and nil when there is none. Decoding drops such a key's
// entry without a word, in a struct (a key's or client's entry, a tenant's
// limits, the top level) as in the tenants map: the file would be loaded
// without it. The places are named as the other errors name them: "" for
// the top level, "keys[0]", "tenants", `tenants["acme"]`.
func refuseNullKeys(data []byte) error {
	k, ok := yamlnull.Find(data, func(parent, key string) string {
		if parent == "tenants" {
			return fmt.Sprintf("tenants[%q]", key)
		}
		return yamlnull.Child(parent, key)
	})
	if !ok {
		return nil
	}
	if k.Place == "tenants" {
		fix := "quote it"
		if k.Value == "" {
			fix = "write the tenant's name"
		}
		return fmt.Errorf("line %d: tenants: the name %s reads as YAML's null, and its limits would be dropped: %s", k.Line, k.Written(), fix)
	}
	where := k.Place
	if where == "" {
		where = "the top level"
	}
	hint := ""
	if strings.HasPrefix(k.Place, `tenants["<<"]`) {
		hint = ` ("<<" quoted, or tagged, is a tenant's name, not a merge key)`
	}
	return fmt.Errorf("line %d: %s: the key %s reads as YAML's null, and its entry would be dropped unread: write the field's name, or remove the entry%s", k.Line, where, k.Written(), hint)
}

// nullTenants returns the entries of keys and clients in the credentials
// document data (decoded already) whose tenant is written as YAML's null
// (null, Null, NULL, ~), which decodes as no tenant: the tenant as written,
// by the entry's place ("keys[0]", "clients[1]"). The tenant is the one
// decoding takes, also through merge keys (tenantNode). A tenant left empty
// is missing, not written, and not returned.
func nullTenants(data []byte) map[string]string {
	var raw struct {
		Keys    yaml.Node `yaml:"keys"`
		Clients yaml.Node `yaml:"clients"`
	}
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil
	}
	nulls := map[string]string{}
	for list, n := range map[string]*yaml.Node{"keys": &raw.Keys, "clients": &raw.Clients} {
		n = deref(n)
		if n.Kind != yaml.SequenceNode {
			continue
		}
		for i, e := range n.Content {
			if v := tenantNode(e, 0); v != nil && v.ShortTag() == "!!null" && v.Value != "" {
				nulls[fmt.Sprintf("%s[%d]", list, i)] = v.Value
			}
		}
	}
	return nulls
}

// tenantNode returns the value of the tenant field of the mapping e as
// decoding into a struct takes it (nil when there is none): the mapping's
// own tenant; otherwise, from its merge key (<<), the first merged mapping,
// in order and each with its own merge key after its own fields, that has
// one. depth bounds merges of merges.
func tenantNode(e *yaml.Node, depth int) *yaml.Node {
	e = deref(e)
	if e == nil || e.Kind != yaml.MappingNode || depth > 32 {
		return nil
	}
	var merge *yaml.Node
	for j := 0; j+1 < len(e.Content); j += 2 {
		k := e.Content[j]
		if yamlnull.IsMergeKey(k) {
			merge = deref(e.Content[j+1])
			continue
		}
		// The key as decoding reads it: also an alias (*t) or !!binary.
		var name string
		if k.Decode(&name) == nil && name == "tenant" {
			return deref(e.Content[j+1])
		}
	}
	if merge == nil {
		return nil
	}
	if merge.Kind == yaml.SequenceNode {
		for _, m := range merge.Content {
			if v := tenantNode(m, depth+1); v != nil {
				return v
			}
		}
		return nil
	}
	return tenantNode(merge, depth+1)
}

// deref returns the node an alias stands for, or n itself.
func deref(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		return n.Alias
	}
	return n
}

// Limits returns the tenant's overrides.
func (c *Credentials) Limits(tenant string) TenantLimits { return c.tenants[tenant] }

func parseScopes(names []string) ([]Scope, error) {
	if len(names) == 0 {
		return nil, errors.New("scopes: at least one of agent, reconciler, viewer")
	}
	var out []Scope
	for _, n := range names {
		switch s := Scope(n); s {
		case ScopeAgent, ScopeReconciler, ScopeViewer:
			out = append(out, s)
		default:
			return nil, fmt.Errorf("scopes: unknown scope %q (want agent, reconciler or viewer)", n)
		}
	}
	return out, nil
}

func validKeyID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// NewAPIKey returns a fresh API key for id ("<id>.<secret>", the secret 256
// random bits) and the hex SHA-256 of its secret, for the credentials file.
func NewAPIKey(id string) (key, secretSHA256 string, err error) {
	if !validKeyID(id) {
		return "", "", fmt.Errorf("key id %q: want 1 to 64 letters, digits, '-' or '_'", id)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	secret := hex.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(secret))
	return id + "." + secret, hex.EncodeToString(sum[:]), nil
}

// Authenticator turns a call's credentials into the caller's principal and
// checks its scope. Its credentials can be replaced while serving (Reload);
// calls in flight keep the set they started with.
type Authenticator struct {
	creds atomic.Pointer[Credentials]
}

// NewAuthenticator returns an Authenticator over creds.
func NewAuthenticator(creds *Credentials) *Authenticator {
	a := &Authenticator{}
	a.creds.Store(creds)
	return a
}

// Reload replaces the credentials (e.g. on SIGHUP). Connections stay open.
func (a *Authenticator) Reload(creds *Credentials) { a.creds.Store(creds) }

// Credentials returns the credentials in force.
func (a *Authenticator) Credentials() *Credentials { return a.creds.Load() }

// dummyHash is compared against when a key id is unknown, so an unknown id
// costs the same time as a wrong secret.
var dummyHash = sha256.Sum256([]byte("no such key"))

// authenticate returns the principal of the call: from a bearer API key, or
// else from a verified client certificate the credentials file maps. The
// errors name no secret.
func (a *Authenticator) authenticate(ctx context.Context) (principal, error) {
	creds := a.creds.Load()
	if vals := metadata.ValueFromIncomingContext(ctx, "authorization"); len(vals) > 0 {
		scheme, token, ok := strings.Cut(vals[0], " ")
		if !ok || !strings.EqualFold(scheme, "bearer") {
			return principal{}, errUnauthenticated("the authorization header must be \"Bearer <key>\"")
		}
		id, secret, _ := strings.Cut(strings.TrimSpace(token), ".")
		k, found := creds.keys[id]
		want := k.hash
		if !found {
			want = dummyHash[:]
		}
		got := sha256.Sum256([]byte(secret))
		if subtle.ConstantTimeCompare(got[:], want) != 1 || !found || k.disabled {
			return principal{}, errUnauthenticated("invalid or revoked API key")
		}
		return principal{Principal: ledger.Principal{Tenant: k.tenant, ID: k.id}, scopes: k.scopes}, nil
	}
	if cert := verifiedClientCert(ctx); cert != nil {
		for _, cl := range creds.clients {
			if cl.commonName != "" && cl.commonName == cert.Subject.CommonName ||
				cl.uri != "" && slices.ContainsFunc(cert.URIs, func(u *url.URL) bool { return u.String() == cl.uri }) {
				id := "cert:" + cert.Subject.CommonName
				if cl.uri != "" {
					id = "cert:" + cl.uri
				}
				return principal{Principal: ledger.Principal{Tenant: cl.tenant, ID: id}, scopes: cl.scopes}, nil
			}
		}
		return principal{}, errUnauthenticated("the client certificate is not mapped to a tenant")
	}
	return principal{}, errUnauthenticated("missing credentials: send \"authorization: Bearer <key>\"")
}

// verifiedClientCert returns the leaf of the peer's verified certificate
// chain, if the connection has one.
func verifiedClientCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return ti.State.VerifiedChains[0][0]
}

// allowed reports whether scopes may call the ledger method.
func allowed(scopes []Scope, method string) bool {
	for _, s := range methodScopes[method] {
		if slices.Contains(scopes, s) {
			return true
		}
	}
	return false
}

// principal is an authenticated caller.
type principal struct {
	ledger.Principal
	scopes []Scope
}

func errUnauthenticated(msg string) error {
	return withDetails(codes.Unauthenticated, msg, info(ReasonUnauthenticated, nil)).Err()
}

func errPermissionDenied(method string) error {
	var need []string
	for _, s := range methodScopes[method] {
		need = append(need, string(s))
	}
	return withDetails(codes.PermissionDenied, "the credentials lack the scope for "+method+" (one of: "+strings.Join(need, ", ")+")",
		info(ReasonPermissionDenied, map[string]string{"method": method, "scopes": strings.Join(need, ",")})).Err()
}
