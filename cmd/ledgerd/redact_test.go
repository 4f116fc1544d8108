package main

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"
)

// TestMalformedRedisURLHidesThePassword: a --redis-url that does not parse
// (an invalid escape, a space, an unclosed IPv6 bracket, a '/' in the
// password) is refused, and neither the error nor the output holds its
// password or a piece of it.
func TestMalformedRedisURLHidesThePassword(t *testing.T) {
	for _, tc := range []struct{ url, secret string }{
		{"redis://user:S3cretPW%zz@127.0.0.1:1/0", "S3cretPW"},
		{"redis://user:S3cretPW%zz@127.0.0.1:1/0", "%zz"},
		{"redis://user:S3cret PW@127.0.0.1:1/0", "S3cret PW"},
		{"redis://user:S3cretPW@[::1/0", "S3cretPW"},
		{"redis://user:S3cr/etPW@127.0.0.1:1/0", "S3cr"},
		{"redis://user:S3cr/etPW@127.0.0.1:1/0", "etPW"},
		{"redis://user:12/S3cretPW@127.0.0.1:1/0", "S3cretPW"},
		{"rediss://:S3cret%PW@127.0.0.1:1/0", "S3cret"},
		{"redis://user:S3cretPW@127.0.0.1:1/x", "S3cretPW"}, // well formed, refused by go-redis
		{"http://user:S3cretPW@127.0.0.1:1/0", "S3cretPW"},
		{"user:S3cretPW@127.0.0.1:1/0", "S3cretPW"},
		{"S3cretPW@127.0.0.1:1/0", "S3cretPW"},
		// The master's password of a sentinel URL is a query parameter.
		{"redis://127.0.0.1:1?master_name=m&username=u&password=S3cretPW&dial_timeout=zz", "S3cretPW"},
		{"redis://127.0.0.1:1?master_name=m&pass%77ord=S3cretPW&bogus=1", "S3cretPW"},
		{"redis://u:pw@127.0.0.1:1?master_name=m&password=S3cret%PW", "S3cret"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--redis-url", tc.url}, &out)
		if err == nil || !strings.Contains(err.Error(), "--redis-url") {
			t.Errorf("%s: %v, want an error about --redis-url", tc.url, err)
		} else if strings.Contains(err.Error()+out.String(), tc.secret) {
			t.Errorf("%s: %q leaked: %v\n%s", tc.url, tc.secret, err, out.String())
		}
		for _, mode := range []string{"cluster", "sentinel"} {
			if _, _, _, err := parseRedisURL(mode, tc.url); err != nil && strings.Contains(err.Error(), tc.secret) {
				t.Errorf("%s (%s): %q leaked: %v", tc.url, mode, tc.secret, err)
			}
		}
	}
}

func TestRedactURL(t *testing.T) {
	for raw, want := range map[string]string{
		"redis://user:pw@127.0.0.1:6379/0":                        "redis://user:xxxxx@127.0.0.1:6379/0",
		"redis://:pw@127.0.0.1:6379/0":                            "redis://:xxxxx@127.0.0.1:6379/0",
		"redis://pw@127.0.0.1:6379/0":                             "redis://xxxxx@127.0.0.1:6379/0",
		"redis://127.0.0.1:6379/0":                                "redis://127.0.0.1:6379/0",
		"redis://u:p@w:o@rd@[::1/0":                               "redis://u:xxxxx@[::1/0",
		"redis://u:a/b@c://d@h/0":                                 "redis://u:xxxxx@h/0",
		"u:pw@127.0.0.1":                                          "u:xxxxx@127.0.0.1",
		"u:p://w@127.0.0.1":                                       "u:xxxxx@127.0.0.1",
		"rediss://u:pw@h:1/0?addr=h2:2":                           "rediss://u:xxxxx@h:1/0?addr=h2:2",
		"unix://u:pw@/run/redis.sock?db=1":                        "unix://u:xxxxx@/run/redis.sock?db=1",
		"redis://u:pw@h:1/0?addr=x@h2:2":                          "redis://u:xxxxx@h2:2",
		"redis://user:S3cret PW@127.0.0.1/0":                      "redis://user:xxxxx@127.0.0.1/0",
		"redis://h:1?master_name=m&password=pw&addr=h2:2":         "redis://h:1?master_name=m&password=xxxxx&addr=h2:2",
		"redis://u:pw@h:1?username=u&password=p%40w&password=pw2": "redis://u:xxxxx@h:1?username=u&password=xxxxx&password=xxxxx",
		"redis://h:1?Pass%77ord=pw#frag":                          "redis://h:1?Pass%77ord=xxxxx#frag",
		"redis://h:1?password":                                    "redis://h:1?password=xxxxx",
		"redis://h:1?password=a@b&addr=h2":                        "redis://h:xxxxx&addr=h2",
		"redis://u:p?password=zz@h:1/0":                           "redis://u:xxxxx",
	} {
		if got := redactURL(raw); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", raw, got, want)
		}
	}
}

// rot changes every letter and digit of s (ROT13, digits by 5), so that a
// string found in the output both before and after is there because it
// came from the input, not because the message's own words hold it.
func rot(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = 'a' + (c-'a'+13)%26
		case 'A' <= c && c <= 'Z':
			b[i] = 'A' + (c-'A'+13)%26
		case '0' <= c && c <= '9':
			b[i] = '0' + (c-'0'+5)%10
		}
	}
	return string(b)
}

// FuzzRedisURLRedaction: whatever --redis-url holds, the error of a URL
// that does not parse, in every mode, never holds its password (of the
// userinfo, or the password parameter of a sentinel URL), as written or
// percent-decoded.
func FuzzRedisURLRedaction(f *testing.F) {
	for _, s := range [][3]string{
		{"user", "S3cretPW%zz", "127.0.0.1:1/0"},
		{"user", "S3cret PW", "127.0.0.1:1/0"},
		{"user", "S3cretPW", "[::1/0"},
		{"user", "S3cr/etPW", "127.0.0.1:1/0"},
		{"", "12/S3cretPW", "h:1/x"},
		{"user", "S3cretPW", "h:1/0?addr=a@b"},
		{"u:x", "S3cret@PW", "h:1/0?dial_timeout=zz"},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, user, pw, rest string) {
		if len(pw) < 4 || pw == rot(pw) {
			return // too short to tell from the message's own words, or nothing to vary
		}
		leaks := func(pw string) []string {
			var found []string
			secrets := []string{pw}
			if d, err := url.PathUnescape(pw); err == nil && len(d) >= 4 {
				secrets = append(secrets, d)
			}
			sep := "?"
			if strings.Contains(rest, "?") {
				sep = "&"
			}
			for _, mode := range []string{"single", "cluster", "sentinel"} {
				// The password in the userinfo, and as a sentinel URL's
				// master password parameter (unless a '#' before it makes
				// it part of the fragment, or a '&' or '#' ends it: what
				// follows is no password).
				raws := []string{"redis://" + user + ":" + pw + "@" + rest}
				if !strings.ContainsAny(pw, "&#") && !strings.Contains(user+rest, "#") {
					raws = append(raws, "redis://"+user+"@"+rest+sep+"master_name=m&password="+pw)
				}
				for _, raw := range raws {
					_, _, _, err := parseRedisURL(mode, raw)
					if err == nil {
						continue
					}
					for _, s := range secrets {
						if strings.Contains(err.Error(), s) && !strings.Contains(user+rest, s) {
							found = append(found, mode+": "+err.Error())
						}
					}
				}
			}
			return found
		}
		if a := leaks(pw); len(a) > 0 {
			if b := leaks(rot(pw)); len(b) > 0 {
				t.Fatalf("password %q leaked: %q; %q leaked: %q", pw, a, rot(pw), b)
			}
		}
	})
}

// TestRedisURLErrorSaysTheForm: a --redis-url ledgerd refuses, malformed or
// refused by go-redis, is answered with the form its --redis-mode wants, as
// docs/configuration.md (section 3.2) writes it.
func TestRedisURLErrorSaysTheForm(t *testing.T) {
	forms := map[string]string{
		"single":   "want redis://[user:password@]host:port[/db]",
		"cluster":  "want redis://[user:password@]seed1:port?addr=seed2:port",
		"sentinel": "want redis://[user:password@]sentinel1:26379?master_name=NAME",
	}
	for mode, form := range forms {
		for _, raw := range []string{"http://x", "redis://user:pw@[::1/0", "127.0.0.1:6379"} {
			_, _, _, err := parseRedisURL(mode, raw)
			if err == nil || !strings.Contains(err.Error(), form) {
				t.Errorf("--redis-mode %s --redis-url %s: %v, want %q", mode, raw, err, form)
			}
		}
	}
	_, _, _, err := parseRedisURL("sentinel", "redis://h:26379")
	if err == nil || !strings.Contains(err.Error(), forms["sentinel"]) {
		t.Errorf("a sentinel URL without master_name: %v, want %q", err, forms["sentinel"])
	}
}
