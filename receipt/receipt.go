// Package receipt signs and verifies the ledger's receipts: compact JWS
// (EdDSA, Ed25519) over the RFC 8785 canonical JSON of what the ledger
// recorded about one operation, verifiable offline with the issuer's JWKS
// (docs/receipts.md).
package receipt

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/opledger/ledger/fingerprint"
)

// Type is the JWS "typ" header of a receipt.
const Type = "opledger-receipt+jws"

// Version is the version of the claims ("v").
const Version = 1

// Claims is what a receipt signs. Fencing tokens are decimal strings, so
// that JavaScript reads them exactly. Hashes are lowercase hex.
type Claims struct {
	Version      int    `json:"v"`
	Issuer       string `json:"iss"`
	IssuedAt     string `json:"iat"` // RFC 3339 in UTC, milliseconds
	Tenant       string `json:"tenant"`
	OperationID  string `json:"operation_id"`
	Tool         string `json:"tool"`
	ParamsSHA256 string `json:"params_sha256"`
	PermitID     string `json:"permit_id"`
	State        string `json:"state"` // STATE_SUCCEEDED, STATE_FAILED_FINAL, STATE_UNKNOWN
	Attempt      uint32 `json:"attempt"`
	FencingToken string `json:"fencing_token"`
	// ResultSHA256 is the SHA-256 of the RFC 8785 canonical JSON of the
	// result, {"data": ..., "resource_id": ...} ("" without a result).
	ResultSHA256 string `json:"result_sha256"`
	ResourceID   string `json:"resource_id"`
	FailureCode  string `json:"failure_code"`
	// FailureDetailSHA256 is the SHA-256 of a FAILED_FINAL operation's
	// failure detail (its UTF-8 bytes); absent without one.
	FailureDetailSHA256 string `json:"failure_detail_sha256,omitempty"`
	// HistoryHead is the head of the operation's history chain when the
	// receipt was signed (docs/receipts.md, "The history chain"); absent on a refusal's.
	HistoryHead string `json:"history_head,omitempty"`
	// Refused is set on the receipt of a refusal: IDEMPOTENCY_KEY_REUSED,
	// with Differs naming what differs; ParamsSHA256, Tool and PermitID are
	// then the refused request's.
	Refused string `json:"refused,omitempty"`
	Differs string `json:"differs,omitempty"`
}

// FailureDetailSHA256 returns the hex SHA-256 of a failure's detail.
func FailureDetailSHA256(detail string) string {
	sum := sha256.Sum256([]byte(detail))
	return hex.EncodeToString(sum[:])
}

// ResultSHA256 returns the hex SHA-256 of the canonical JSON of a result:
// {"data": its data (canonical JSON, or nil for none), "resource_id": its
// id}. It refuses data that is not JSON or that fingerprint.Canonical
// refuses; data as deep as Canonical takes is not one level too deep for
// the object around it, which is written here.
func ResultSHA256(data []byte, resourceID string) (string, error) {
	var v any = map[string]any{}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &v); err != nil {
			return "", fmt.Errorf("result data: %w", err)
		}
	}
	d, err := fingerprint.Canonical(v)
	if err != nil {
		return "", fmt.Errorf("result data: %w", err)
	}
	id, err := fingerprint.Canonical(resourceID)
	if err != nil {
		return "", fmt.Errorf("resource id: %w", err)
	}
	c := append(append(append(append([]byte(`{"data":`), d...), `,"resource_id":`...), id...), '}')
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// Key is one Ed25519 key with its key id.
type Key struct {
	ID      string
	Private ed25519.PrivateKey // nil for a key that only verifies
	Public  ed25519.PublicKey
}

// NewKey makes a signing key with id kid (a random one when empty).
func NewKey(kid string) (*Key, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	if kid == "" {
		b := make([]byte, 8)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		kid = "r-" + hex.EncodeToString(b)
	}
	return &Key{ID: kid, Private: priv, Public: pub}, nil
}

// MarshalJWK returns k as a JWK (with its private part, when it has one).
func (k *Key) MarshalJWK() ([]byte, error) {
	var key any = k.Public
	if k.Private != nil {
		key = k.Private
	}
	return json.MarshalIndent(jose.JSONWebKey{Key: key, KeyID: k.ID, Algorithm: string(jose.EdDSA), Use: "sig"}, "", "  ")
}

// ParseJWK reads a key from a JWK: an Ed25519 key (OKP) with a key id.
func ParseJWK(b []byte) (*Key, error) {
	var jwk jose.JSONWebKey
	if err := jwk.UnmarshalJSON(b); err != nil {
		var set struct {
			Keys json.RawMessage `json:"keys"`
		}
		if json.Unmarshal(b, &set) == nil && set.Keys != nil {
			return nil, errors.New("a JWK Set, not one key: give each key's own file (ledgerd keygen --receipts writes one)")
		}
		return nil, fmt.Errorf("not a JWK: %w", err)
	}
	if jwk.KeyID == "" {
		return nil, errors.New("the JWK has no key id (kid)")
	}
	switch key := jwk.Key.(type) {
	case ed25519.PrivateKey:
		return &Key{ID: jwk.KeyID, Private: key, Public: key.Public().(ed25519.PublicKey)}, nil
	case ed25519.PublicKey:
		return &Key{ID: jwk.KeyID, Public: key}, nil
	default:
		return nil, fmt.Errorf("key %s is not an Ed25519 key", jwk.KeyID)
	}
}

// LoadKeys reads the key files: the first signs (it must hold a private
// key), the others only verify (rotation: a previous key keeps verifying
// what it signed). Key ids must differ.
func LoadKeys(paths []string) ([]*Key, error) {
	var keys []*Key
	seen := map[string]bool{}
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		k, err := ParseJWK(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if i == 0 && k.Private == nil {
			return nil, fmt.Errorf("%s: the first key signs, so it needs its private part (d)", p)
		}
		if seen[k.ID] {
			return nil, fmt.Errorf("%s: key id %q appears twice", p, k.ID)
		}
		seen[k.ID] = true
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no receipt keys")
	}
	return keys, nil
}

// JWKS returns the public keys as a JSON Web Key Set.
func JWKS(keys []*Key) jose.JSONWebKeySet {
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public, KeyID: k.ID, Algorithm: string(jose.EdDSA), Use: "sig"})
	}
	return set
}

// Signer signs receipts with the first of its keys.
type Signer struct {
	issuer string
	keys   []*Key
	signer jose.Signer
	now    func() time.Time
}

// NewSigner returns a Signer for issuer with keys (LoadKeys' order).
func NewSigner(issuer string, keys []*Key) (*Signer, error) {
	if issuer == "" {
		return nil, errors.New("receipt issuer: empty")
	}
	if len(keys) == 0 || keys[0].Private == nil {
		return nil, errors.New("receipts need a signing key")
	}
	opts := (&jose.SignerOptions{}).WithType(Type)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA,
		Key: jose.JSONWebKey{Key: keys[0].Private, KeyID: keys[0].ID}}, opts)
	if err != nil {
		return nil, err
	}
	return &Signer{issuer: issuer, keys: keys, signer: s, now: time.Now}, nil
}

// object is c as the JSON object it signs, with the names and omissions of
// its json tags (TestClaimsObject checks they agree).
func (c Claims) object() map[string]any {
	m := map[string]any{
		"v": c.Version, "iss": c.Issuer, "iat": c.IssuedAt, "tenant": c.Tenant, "operation_id": c.OperationID,
		"tool": c.Tool, "params_sha256": c.ParamsSHA256, "permit_id": c.PermitID, "state": c.State,
		"attempt": int64(c.Attempt), "fencing_token": c.FencingToken, "result_sha256": c.ResultSHA256,
		"resource_id": c.ResourceID, "failure_code": c.FailureCode,
	}
	for k, v := range map[string]string{"failure_detail_sha256": c.FailureDetailSHA256, "history_head": c.HistoryHead,
		"refused": c.Refused, "differs": c.Differs} {
		if v != "" {
			m[k] = v
		}
	}
	return m
}

// JWKS returns the public keys of every key of s.
func (s *Signer) JWKS() jose.JSONWebKeySet { return JWKS(s.keys) }

// Sign returns the compact JWS of c, with the version, issuer and time set.
func (s *Signer) Sign(c Claims) (string, error) {
	c.Version, c.Issuer = Version, s.issuer
	c.IssuedAt = s.now().UTC().Format("2006-01-02T15:04:05.000Z07:00")
	payload, err := fingerprint.Canonical(c.object())
	if err != nil {
		return "", err
	}
	jws, err := s.signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

// Verify checks a compact JWS receipt against a key set and returns its
// claims. It refuses another algorithm or type, an unknown key id, a bad
// signature and a payload that is not canonical JSON.
func Verify(compact string, set jose.JSONWebKeySet) (*Claims, error) {
	jws, err := jose.ParseSignedCompact(compact, []jose.SignatureAlgorithm{jose.EdDSA})
	if err != nil {
		return nil, fmt.Errorf("not a receipt: %w", err)
	}
	if len(jws.Signatures) != 1 || jws.Signatures[0].Protected.ExtraHeaders["typ"] != Type {
		return nil, fmt.Errorf("not a receipt: typ is not %s", Type)
	}
	payload, err := jws.Verify(set)
	if err != nil {
		return nil, fmt.Errorf("the signature does not verify: %w", err)
	}
	var generic map[string]any
	if err := json.Unmarshal(payload, &generic); err != nil {
		return nil, fmt.Errorf("the payload is not JSON: %w", err)
	}
	if canon, err := fingerprint.Canonical(generic); err != nil || string(canon) != string(payload) {
		return nil, errors.New("the payload is not canonical JSON (RFC 8785)")
	}
	var c Claims
	if err := json.Unmarshal(payload, &c); err != nil {
		return nil, err
	}
	if c.Version != Version {
		return nil, errors.New("unknown receipt version " + strconv.Itoa(c.Version))
	}
	return &c, nil
}

// JWKSPath is where the public keys are served.
const JWKSPath = "/.well-known/jwks.json"

// JWKSHandler serves the public keys of s as a JWK Set.
func (s *Signer) JWKSHandler() http.Handler {
	body, err := json.Marshal(s.JWKS())
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			http.Error(w, "the key set cannot be encoded", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=300")
		_, _ = w.Write(body)
	})
}
