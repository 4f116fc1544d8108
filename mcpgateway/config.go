package mcpgateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/opledger/ledger/fingerprint"
	"github.com/opledger/ledger/internal/yamlerr"
	"github.com/opledger/ledger/internal/yamlnull"
	"github.com/opledger/ledger/ledger"
)

// Config is the gateway's configuration file (docs/mcp.md).
type Config struct {
	Ledger    LedgerConfig     `yaml:"ledger"`
	HTTP      HTTPConfig       `yaml:"http"`
	Metrics   MetricsConfig    `yaml:"metrics"`
	Defaults  ToolRule         `yaml:"defaults"`
	Reconcile ReconcileConfig  `yaml:"reconcile"`
	Upstreams []UpstreamConfig `yaml:"upstreams"`
}

// LedgerConfig says how the gateway reaches ledgerd.
type LedgerConfig struct {
	// Address is ledgerd's host:port (127.0.0.1:50051).
	Address string `yaml:"address"`
	// APIKeyEnv names the environment variable holding the key that stdio
	// callers, and anonymous HTTP callers, act under.
	APIKeyEnv string `yaml:"api_key_env"`
	// TLS, when set, connects with TLS.
	TLS *ClientTLS `yaml:"tls"`

	apiKey string
}

// ClientTLS is the TLS of the connection to ledgerd.
type ClientTLS struct {
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// MetricsConfig is the Prometheus /metrics listener.
type MetricsConfig struct {
	// Listen is its host:port; empty: off.
	Listen string `yaml:"listen"`
	// TenantLabel adds the tenant of each call's key to the call metrics.
	TenantLabel bool `yaml:"tenant_label"`
}

func (m MetricsConfig) check() error {
	if m.Listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(m.Listen); err != nil {
		return fmt.Errorf("listen %q: want HOST:PORT, e.g. 127.0.0.1:9465", m.Listen)
	}
	return nil
}

// HTTPConfig is the Streamable HTTP listener; without Listen the gateway
// serves stdio.
type HTTPConfig struct {
	Listen string `yaml:"listen"`
	// Path is where MCP is served (/mcp).
	Path string `yaml:"path"`
	// Anonymous lets requests without Authorization act under the
	// gateway's own key; only on a loopback listener.
	Anonymous bool `yaml:"anonymous"`
	// TLS is required on a listener beyond loopback.
	TLS *ServerTLS `yaml:"tls"`
	// SessionIdleTimeout closes sessions idle that long (1h).
	SessionIdleTimeout Duration `yaml:"session_idle_timeout"`
	// MaxConnections is how many connections the listener holds open at
	// once (10000); 0: no limit. One more waits to be accepted until one
	// closes.
	MaxConnections *int `yaml:"max_connections"`
}

// ServerTLS is the certificate of the HTTP listener.
type ServerTLS struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// ReconcileConfig is the background reconciliation of tools with a probe.
type ReconcileConfig struct {
	// Interval between passes (10s).
	Interval Duration `yaml:"interval"`
	// APIKeyEnvs name the environment variables of the keys (reconciler
	// scope, one per tenant) the passes act under; without them, the
	// gateway's own key.
	APIKeyEnvs []string `yaml:"api_key_envs"`

	apiKeys []string
}

// UpstreamConfig is one MCP server behind the gateway: a command (stdio)
// or a URL (Streamable HTTP).
type UpstreamConfig struct {
	Name string `yaml:"name"`
	// Prefix is put before its tools' names (Name + "_" when unset).
	Prefix  *string           `yaml:"prefix"`
	Command []string          `yaml:"command"`
	Env     map[string]string `yaml:"env"`
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
	// Tools are policies by tool name; the first rule that matches wins.
	Tools []ToolRule `yaml:"tools"`
}

// ToolRule is the gateway's policy for the tools it matches. Unset fields
// take the defaults.
type ToolRule struct {
	// Match is a glob on the upstream's tool name (* any run, ? one
	// character); not used in defaults.
	Match string `yaml:"match"`
	// Effect is read_only, idempotent or irreversible (else from the
	// tool's annotations).
	Effect string `yaml:"effect"`
	// Key is session, require or none (see docs/mcp.md).
	Key string `yaml:"key"`
	// Window is the session mode's dedupe window (10m).
	Window Duration `yaml:"window"`
	// Params are JSON pointers to the consequential arguments (all when
	// empty).
	Params []string `yaml:"params"`
	// Timeout bounds each forward (60s).
	Timeout Duration `yaml:"timeout"`
	// Retries are forwards after one proven not applied (0).
	Retries *int `yaml:"retries"`
	// Wait bounds the wait for another call of the same operation (30s).
	Wait Duration `yaml:"wait"`
	// Errors says what an isError result is: final or retryable.
	Errors string `yaml:"errors"`
	// ResourceID is a JSON pointer into structuredContent whose value is
	// recorded as the resource id.
	ResourceID string `yaml:"resource_id"`
	// Probe looks an effect up by its idempotency key.
	Probe *ProbeConfig `yaml:"probe"`
}

// ProbeConfig names the upstream tool that finds an effect by key.
type ProbeConfig struct {
	// Tool is the upstream's tool name.
	Tool string `yaml:"tool"`
	// Argument carries the key (idempotency_key).
	Argument string `yaml:"argument"`
	// NotFoundAfter is how long an operation must have been unresolved
	// before "not found" counts as not applied (30s).
	NotFoundAfter Duration `yaml:"not_found_after"`
}

// Duration is a Go duration written as a string ("30s", "10m").
type Duration time.Duration

// UnmarshalYAML refuses bare numbers, which would read as nanoseconds,
// and a duration that is not positive: no field takes one, and a field
// left at 0 takes its default, which 0s written out would silently get.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" || err != nil {
		return fmt.Errorf("line %d: want a duration such as 30s or 10m (units: ms, s, m, h; no d)", n.Line)
	}
	if v <= 0 {
		return fmt.Errorf("line %d: %s: want a positive duration (leave the field out for its default)", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// The defaults of ToolRule.
const (
	DefaultWindow        = 10 * time.Minute
	DefaultTimeout       = 60 * time.Second
	DefaultWait          = 30 * time.Second
	DefaultNotFoundAfter = 30 * time.Second
	DefaultInterval      = 10 * time.Second
	DefaultIdleTimeout   = time.Hour
	// DefaultMaxConnections is HTTPConfig.MaxConnections's.
	DefaultMaxConnections = 10000
)

// LoadConfig reads and checks a configuration file, expanding ${NAME} in
// env and header values from the environment.
func LoadConfig(file string) (*Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(data, os.LookupEnv)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return c, nil
}

// ParseConfig parses and checks a configuration document; lookup reads
// the environment. Unknown fields, a key YAML reads as null, a second
// document and values out of range are errors.
func ParseConfig(data []byte, lookup func(string) (string, bool)) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the file is empty: at least one upstream is needed")
		}
		return nil, yamlerr.Readable(err, data)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, errors.New("the file must hold exactly one YAML document")
	}
	if k, ok := yamlnull.Find(data, nil); ok {
		return nil, fmt.Errorf("line %d: the key %s reads as YAML's null, and its entry would be dropped unread", k.Line, k.Written())
	}
	if err := c.check(lookup); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) check(lookup func(string) (string, bool)) error {
	if c.Ledger.Address == "" {
		c.Ledger.Address = "127.0.0.1:50051"
	}
	if _, _, err := net.SplitHostPort(c.Ledger.Address); err != nil {
		return fmt.Errorf("ledger.address %q: want HOST:PORT", c.Ledger.Address)
	}
	var err error
	if c.Ledger.APIKeyEnv != "" {
		if c.Ledger.apiKey, err = secret(lookup, c.Ledger.APIKeyEnv); err != nil {
			return fmt.Errorf("ledger.api_key_env: %w", err)
		}
	}
	if t := c.Ledger.TLS; t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		return errors.New("ledger.tls: cert_file and key_file go together")
	}
	if err := c.HTTP.check(); err != nil {
		return fmt.Errorf("http: %w", err)
	}
	if err := c.Metrics.check(); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if err := c.Reconcile.check(lookup); err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	if c.Defaults.Match != "" || c.Defaults.Probe != nil || c.Defaults.Effect != "" {
		return errors.New("defaults: match, effect and probe belong to a tool rule")
	}
	if c.Defaults.Key == keyNone {
		return errors.New("defaults: key none would forward tools that change things unrecorded; set it on read-only tools' rules (it is their default already)")
	}
	if err := c.Defaults.check(); err != nil {
		return fmt.Errorf("defaults: %w", err)
	}
	if len(c.Upstreams) == 0 {
		return errors.New("upstreams: at least one is needed")
	}
	names, prefixes := map[string]bool{}, map[string]bool{}
	for i := range c.Upstreams {
		u := &c.Upstreams[i]
		if err := u.check(lookup); err != nil {
			return fmt.Errorf("upstreams[%d] (%s): %w", i, u.Name, err)
		}
		if names[u.Name] {
			return fmt.Errorf("upstreams[%d]: a second upstream named %q", i, u.Name)
		}
		if prefixes[*u.Prefix] {
			return fmt.Errorf("upstreams[%d] (%s): prefix %q is another upstream's too", i, u.Name, *u.Prefix)
		}
		names[u.Name], prefixes[*u.Prefix] = true, true
	}
	return nil
}

// Override sets the ledger's address, the HTTP listener and the metrics
// listener, where given (the command line's), and checks them.
func Override(c *Config, ledgerAddr, listen, metricsListen string) error {
	if ledgerAddr != "" {
		if _, _, err := net.SplitHostPort(ledgerAddr); err != nil {
			return fmt.Errorf("ledger address %q: want HOST:PORT", ledgerAddr)
		}
		c.Ledger.Address = ledgerAddr
	}
	if listen != "" {
		c.HTTP.Listen = listen
		if err := c.HTTP.check(); err != nil {
			return fmt.Errorf("http: %w", err)
		}
	}
	if metricsListen != "" {
		c.Metrics.Listen = metricsListen
		if err := c.Metrics.check(); err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
	}
	return nil
}

func (h *HTTPConfig) check() error {
	if h.Path == "" {
		h.Path = "/mcp"
	}
	if !strings.HasPrefix(h.Path, "/") {
		return fmt.Errorf("path %q: want an absolute path such as /mcp", h.Path)
	}
	if h.Path == HealthPath {
		return fmt.Errorf("path %q is the health probe's: want another, such as /mcp", h.Path)
	}
	if h.SessionIdleTimeout == 0 {
		h.SessionIdleTimeout = Duration(DefaultIdleTimeout)
	}
	if h.MaxConnections == nil {
		h.MaxConnections = new(DefaultMaxConnections)
	}
	if *h.MaxConnections < 0 {
		return fmt.Errorf("max_connections %d: want 0 (no limit) or more", *h.MaxConnections)
	}
	if h.TLS != nil && (h.TLS.CertFile == "" || h.TLS.KeyFile == "") {
		return errors.New("tls: cert_file and key_file are both needed")
	}
	if h.Listen == "" {
		return nil
	}
	return h.checkListen()
}

// checkListen refuses a listener beyond loopback without TLS, or one that
// lets anonymous callers in.
func (h *HTTPConfig) checkListen() error {
	host, _, err := net.SplitHostPort(h.Listen)
	if err != nil {
		return fmt.Errorf("listen %q: want HOST:PORT", h.Listen)
	}
	if loopback(host) {
		return nil
	}
	if h.Anonymous {
		return fmt.Errorf("anonymous: only on a loopback listener, not %q", h.Listen)
	}
	if h.TLS == nil {
		return fmt.Errorf("listen %q is beyond loopback: callers' API keys need tls (cert_file, key_file)", h.Listen)
	}
	return nil
}

// loopback reports whether host names this machine.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (r *ReconcileConfig) check(lookup func(string) (string, bool)) error {
	if r.Interval == 0 {
		r.Interval = Duration(DefaultInterval)
	}
	if r.Interval < Duration(100*time.Millisecond) {
		return fmt.Errorf("interval %s: want at least 100ms", time.Duration(r.Interval))
	}
	for _, name := range r.APIKeyEnvs {
		key, err := secret(lookup, name)
		if err != nil {
			return fmt.Errorf("api_key_envs: %w", err)
		}
		r.apiKeys = append(r.apiKeys, key)
	}
	return nil
}

// probes reports whether a tool rule has a probe.
func (c *Config) probes() bool {
	for _, u := range c.Upstreams {
		for _, r := range u.Tools {
			if r.Probe != nil {
				return true
			}
		}
	}
	return false
}

// secret reads a key from the environment variable name.
func secret(lookup func(string) (string, bool), name string) (string, error) {
	v, ok := lookup(name)
	if !ok || v == "" {
		return "", fmt.Errorf("the environment variable %s is not set", name)
	}
	return v, nil
}

var upstreamName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

func (u *UpstreamConfig) check(lookup func(string) (string, bool)) error {
	if !upstreamName.MatchString(u.Name) {
		return errors.New("name: want 1 to 32 lowercase letters, digits, _ or -, from a letter")
	}
	if u.Prefix == nil {
		p := u.Name + "_"
		u.Prefix = &p
	}
	if *u.Prefix != "" && ledger.ValidateTool(*u.Prefix) != nil {
		return fmt.Errorf("prefix %q: may only hold letters, digits and . _ - : /, up to %d with the tool's name", *u.Prefix, ledger.MaxToolLen)
	}
	switch {
	case len(u.Command) > 0 && u.URL != "":
		return errors.New("command and url: give one")
	case len(u.Command) > 0:
		if len(u.Headers) > 0 {
			return errors.New("headers: only with url")
		}
	case u.URL != "":
		if len(u.Env) > 0 {
			return errors.New("env: only with command")
		}
		x, err := expand(u.URL, lookup)
		if err != nil {
			return fmt.Errorf("url: %w", err)
		}
		if p, err := url.Parse(x); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("url %q: want http:// or https://", u.URL)
		}
		u.URL = x
	default:
		return errors.New("command or url: one is needed")
	}
	for _, m := range []map[string]string{u.Env, u.Headers} {
		// In name order, so that of two bad values the same one is named.
		for _, k := range slices.Sorted(maps.Keys(m)) {
			x, err := expand(m[k], lookup)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			m[k] = x
		}
	}
	for i := range u.Tools {
		t := &u.Tools[i]
		if t.Match == "" {
			return fmt.Errorf("tools[%d]: match is required", i)
		}
		if err := t.check(); err != nil {
			return fmt.Errorf("tools[%d] (%s): %w", i, t.Match, err)
		}
	}
	return nil
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// expand replaces each ${NAME} in s with the environment variable NAME,
// refusing one that is not set.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	var missing string
	out := envRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := envRef.FindStringSubmatch(ref)[1]
		v, ok := lookup(name)
		if !ok && missing == "" {
			missing = name
		}
		return v
	})
	if missing != "" {
		return "", fmt.Errorf("the environment variable %s is not set", missing)
	}
	return out, nil
}

func (t *ToolRule) check() error {
	if t.Effect != "" {
		if _, ok := effects[t.Effect]; !ok {
			return fmt.Errorf("effect %q: want read_only, idempotent or irreversible", t.Effect)
		}
	}
	switch t.Key {
	case "", keySession, keyRequire:
	case keyNone:
		if t.Effect != "" && t.Effect != "read_only" {
			return fmt.Errorf("key none: only for read-only tools, not %s ones (nothing would stop a second effect)", t.Effect)
		}
	default:
		return fmt.Errorf("key %q: want session, require or none", t.Key)
	}
	if t.Errors != "" && t.Errors != "final" && t.Errors != "retryable" {
		return fmt.Errorf("errors %q: want final or retryable", t.Errors)
	}
	if t.Retries != nil && (*t.Retries < 0 || *t.Retries > 10) {
		return fmt.Errorf("retries %d: want 0 to 10", *t.Retries)
	}
	for _, p := range append(append([]string(nil), t.Params...), t.ResourceID) {
		if p == "" {
			continue
		}
		if err := fingerprint.ValidatePointer(p); err != nil {
			return fmt.Errorf("JSON pointer %q: %v", p, err)
		}
	}
	if p := t.Probe; p != nil {
		if p.Tool == "" {
			return errors.New("probe.tool is required")
		}
		if p.Argument == "" {
			p.Argument = "idempotency_key"
		}
		if p.NotFoundAfter == 0 {
			p.NotFoundAfter = Duration(DefaultNotFoundAfter)
		}
	}
	return nil
}
