package main

import (
	"fmt"
	"net/url"
	"strings"
)

// redactURL returns raw with the password of its userinfo, and the value of
// every query parameter whose name holds "password" (a sentinel URL's
// master password), replaced by "xxxxx". It does not parse raw, so that a
// malformed URL is redacted too: the userinfo is everything between "://"
// (or the start, without a scheme) and the last '@'; its user name, before
// the first ':', stays (a userinfo without ':' is redacted whole). Over-redacting
// an '@' outside the userinfo is the price of never showing a password;
// when that '@' is inside a password parameter's value, the value's rest is
// cut too.
func redactURL(raw string) string {
	start := 0
	if i := strings.Index(raw, "://"); i > 0 && validScheme(raw[:i]) {
		start = i + len("://")
	}
	at := strings.LastIndexByte(raw, '@')
	if at < start {
		return raw[:start] + redactQuery(raw[start:])
	}
	user, _, ok := strings.Cut(raw[start:at], ":")
	if !ok {
		user = ""
	} else {
		user += ":"
	}
	rest := raw[at:]
	if inPasswordParam(raw[start:at]) {
		end := strings.IndexAny(rest, "&#")
		if end < 0 {
			end = len(rest)
		}
		rest = rest[end:]
	}
	if q := strings.IndexByte(raw[start:at], '?'); q >= 0 && strings.IndexByte(raw[start+q:at], '#') < 0 {
		// The last '@' is in the query: rest is the query's rest.
		return raw[:start] + user + "xxxxx" + redactParams(rest)
	}
	return raw[:start] + user + "xxxxx" + redactQuery(rest)
}

// redactQuery replaces the values of s's query parameters (after its first
// '?', up to a '#') whose names hold "password" by "xxxxx".
func redactQuery(s string) string {
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	return s[:q+1] + redactParams(s[q+1:])
}

// redactParams replaces the values of the query parameters of s (up to a
// '#') whose names hold "password" by "xxxxx".
func redactParams(query string) string {
	frag := ""
	if h := strings.IndexByte(query, '#'); h >= 0 {
		query, frag = query[:h], query[h:]
	}
	params := strings.Split(query, "&")
	for i, p := range params {
		if k, _, _ := strings.Cut(p, "="); isPasswordParam(k) {
			params[i] = k + "=xxxxx"
		}
	}
	return strings.Join(params, "&") + frag
}

// inPasswordParam reports whether s ends inside the value of a query
// parameter whose name holds "password".
func inPasswordParam(s string) bool {
	q := strings.IndexByte(s, '?')
	if q < 0 || strings.IndexByte(s[q:], '#') >= 0 {
		return false
	}
	last := s[q+1:]
	if a := strings.LastIndexByte(last, '&'); a >= 0 {
		last = last[a+1:]
	}
	k, _, ok := strings.Cut(last, "=")
	return ok && isPasswordParam(k)
}

// isPasswordParam reports whether the query parameter name k (as written,
// or percent-decoded) holds "password", in any case.
func isPasswordParam(k string) bool {
	if d, err := url.QueryUnescape(k); err == nil {
		k = d
	}
	return strings.Contains(strings.ToLower(k), "password")
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.').
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		case i > 0 && ('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'):
		default:
			return false
		}
	}
	return s != ""
}

// redisURLForms are the forms of --redis-url, by --redis-mode, as
// docs/configuration.md (section 3.2) writes them.
var redisURLForms = map[string]string{
	"single":   "redis://[user:password@]host:port[/db] (rediss:// for TLS, or unix:///path/to/redis.sock)",
	"cluster":  "redis://[user:password@]seed1:port?addr=seed2:port&addr=seed3:port (rediss:// for TLS)",
	"sentinel": "redis://[user:password@]sentinel1:26379?master_name=NAME&addr=sentinel2:26379 (rediss:// for TLS)",
}

// redisURLError is the error for a --redis-url that go-redis refused with
// err, without the URL's password: the URL is shown redacted (redactURL),
// and the form mode wants follows.
// go-redis's message is kept only when the URL is well formed and its last
// '@' ends its userinfo, so that no piece of the password can be elsewhere
// in it, and then with the password replaced. Otherwise (url.Parse failed,
// and its error quotes the input, or a piece of it such as an invalid
// escape or port) a message of its own replaces it.
func redisURLError(mode, raw string, err error) error {
	reason := "not a valid URL (reserved characters in the user name and password must be percent-encoded)"
	if u, perr := url.Parse(raw); perr == nil && u.Opaque == "" && !strings.ContainsRune(u.Host+u.Path+u.RawPath+u.RawQuery+u.Fragment, '@') {
		reason = err.Error()
		var secrets []string
		if u.User != nil {
			secrets = append(secrets, u.User.String())
			if p, ok := u.User.Password(); ok {
				secrets = append(secrets, p)
			}
			if start := strings.Index(raw, "://"); start >= 0 {
				if at := strings.LastIndexByte(raw, '@'); at > start {
					if _, p, ok := strings.Cut(raw[start+3:at], ":"); ok {
						secrets = append(secrets, p)
					}
				}
			}
		}
		// A password parameter's value, as written and decoded.
		for _, p := range strings.Split(u.RawQuery, "&") {
			if k, v, _ := strings.Cut(p, "="); isPasswordParam(k) {
				secrets = append(secrets, v)
				if d, err := url.QueryUnescape(v); err == nil {
					secrets = append(secrets, d)
				}
			}
		}
		for _, s := range secrets {
			if s != "" {
				reason = strings.ReplaceAll(reason, s, "xxxxx")
			}
		}
	}
	return fmt.Errorf("--redis-url %s (%s): %s; want %s", redactURL(raw), mode, reason, redisURLForms[mode])
}
