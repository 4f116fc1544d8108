package mcpgateway

import "testing"

// TestClientFormats: an output schema's formats are checked as the
// official TypeScript client checks them, so that no answer the gateway
// passes on makes that client throw. Each row is the client's verdict, but
// for the rows where the gateway is stricter by design (an IP address as a
// url's host, a line of base64 ended by a carriage return). With node and
// examples/mcp/node's packages installed, the client itself checks every
// row too (required with LEDGER_TEST_POLYGLOT=require). A regex is read
// with the u flag, as a pattern is, where the client reads it without:
// stricter.
func TestClientFormats(t *testing.T) {
	rows := []struct {
		format   string
		value    any
		want     bool
		stricter bool // the client takes it; the gateway does not
	}{
		{"date", "2024-02-29", true, false},
		{"date", "2023-02-29", false, false},
		{"date", "2024-13-01", false, false},
		{"date", "2024-1-01", false, false},
		{"date", "2024-01-01T00:00:00Z", false, false},
		{"date", "0000-01-01", true, false},
		{"date", "2024-04-31", false, false},
		{"time", "12:00:00Z", true, false},
		{"time", "12:00:00", false, false},
		{"time", "12:00:00+01:00", true, false},
		{"time", "23:59:60Z", true, false},
		{"time", "23:59:60+01:00", false, false},
		{"time", "12:00:00.123Z", true, false},
		{"time", "24:00:00Z", false, false},
		{"time", "12:00Z", false, false},
		{"time", "12:00:00z", true, false},
		{"time", "12:00:00+0100", true, false},
		{"date-time", "2024-01-01T12:00:00Z", true, false},
		{"date-time", "2024-01-01t12:00:00z", true, false},
		{"date-time", "2024-01-01 12:00:00Z", true, false},
		{"date-time", "2024-01-01T12:00:00", false, false},
		{"date-time", "2024-06-30T23:59:60Z", true, false},
		{"date-time", "2024-01-01T23:59:60Z", true, false},
		{"date-time", "2024-01-01T12:00:00.5+05:30", true, false},
		{"date-time", "2024-02-30T12:00:00Z", false, false},
		{"date-time", "2024-01-01T12:00:00+24:00", false, false},
		{"duration", "P1D", true, false},
		{"duration", "PT1H", true, false},
		{"duration", "P1W", true, false},
		{"duration", "P1Y2M", true, false},
		{"duration", "PT", false, false},
		{"duration", "P", false, false},
		{"duration", "P1DT", false, false},
		{"duration", "P1.5D", false, false},
		{"duration", "PT1.5S", false, false},
		{"duration", "P1W2D", false, false},
		{"duration", "-P1D", false, false},
		{"uri", "https://example.com", true, false},
		{"uri", "mailto:a@b", true, false},
		{"uri", "urn:isbn:123", true, false},
		{"uri", "/relative", false, false},
		{"uri", "https://example.com/a b", false, false},
		{"uri", "https://exa mple.com", false, false},
		{"uri", "http://[::1]/", true, false},
		{"uri", "http://example.com/%zz", false, false},
		{"uri", "a:b", true, false},
		{"uri", "http://example.com/#frag#frag", false, false},
		{"uri", "http://ex ample.com", false, false},
		{"uri", "https://例え.jp/", false, false},
		{"uri-reference", "/a", true, false},
		{"uri-reference", "a b", false, false},
		{"uri-reference", "#f", true, false},
		{"uri-reference", "http://x/%zz", false, false},
		{"uri-reference", "\\\\x", false, false},
		{"email", "a@b.co", true, false},
		{"email", "a@b", false, false},
		{"email", "a.@b.co", false, false},
		{"email", "\"a b\"@c.co", false, false},
		{"email", "a@[127.0.0.1]", false, false},
		{"email", "a@localhost", false, false},
		{"email", "a..b@c.co", false, false},
		{"email", "a@-b.co", false, false},
		{"email", "é@b.co", false, false},
		{"hostname", "example.com", true, false},
		{"hostname", "-example.com", false, false},
		{"hostname", "example-.com", false, false},
		{"hostname", "a.b.c", true, false},
		{"hostname", "a_b.com", false, false},
		{"hostname", "xn--e1afmkfd.xn--p1ai", true, false},
		{"hostname", "example.com.", true, false},
		{"hostname", "toolonglabeltoolonglabeltoolonglabeltoolonglabeltoolonglabeltoolonglabel.com", false, false},
		{"hostname", "localhost", true, false},
		{"hostname", "1.2.3.4", true, false},
		{"ipv4", "1.2.3.4", true, false},
		{"ipv4", "01.2.3.4", false, false},
		{"ipv4", "256.1.1.1", false, false},
		{"ipv4", "1.2.3", false, false},
		{"ipv4", "1.2.3.4 ", false, false},
		{"ipv6", "::1", true, false},
		{"ipv6", "1::", true, false},
		{"ipv6", "::ffff:1.2.3.4", true, false},
		{"ipv6", "fe80::1%eth0", false, false},
		{"ipv6", "1:2:3:4:5:6:7:8:9", false, false},
		{"ipv6", "::1/128", false, false},
		{"ipv6", "1::2::3", false, false},
		{"uuid", "123e4567-e89b-12d3-a456-426614174000", true, false},
		{"uuid", "123E4567-E89B-12D3-A456-426614174000", true, false},
		{"uuid", "123e4567e89b12d3a456426614174000", false, false},
		{"uuid", "urn:uuid:123e4567-e89b-12d3-a456-426614174000", true, false},
		{"uuid", "{123e4567-e89b-12d3-a456-426614174000}", false, false},
		{"uuid", "123e4567-e89b-12d3-a456-42661417400", false, false},
		{"json-pointer", "", true, false},
		{"json-pointer", "/a", true, false},
		{"json-pointer", "a", false, false},
		{"json-pointer", "/a~2", false, false},
		{"json-pointer", "/a~0~1", true, false},
		{"json-pointer", "/", true, false},
		{"relative-json-pointer", "0", true, false},
		{"relative-json-pointer", "1/a", true, false},
		{"relative-json-pointer", "0#", true, false},
		{"relative-json-pointer", "-1", false, false},
		{"relative-json-pointer", "01", false, false},
		{"uri-template", "http://x/{a}", true, false},
		{"uri-template", "http://x/{a", false, false},
		{"uri-template", "{+a}", true, false},
		{"uri-template", "{a b}", false, false},
		{"byte", "aGVsbG8=", true, false},
		{"byte", "aGVsbG8", false, false},
		{"byte", "a", false, false},
		{"url", "https://example.com/a?b=c", true, false},
		{"url", "ftp://files.example.org", true, false},
		{"url", "http://10.0.0.1/", false, false},
		{"url", "http://8.8.8.8/", false, true},
		{"url", "https://localhost/", false, false},
		{"url", "https://example.com/a\u00a0b", false, false},
		{"email", "\u212a@b.co", false, false},
		{"time", "00:59:60+01:00", true, false},
		{"byte", "!!!\n", true, false},
		{"byte", "!!!\r", false, true},
		{"iso-time", "12:00:00", true, false},
		{"iso-date-time", "2024-01-01 12:00:00", true, false},
		{"json-pointer-uri-fragment", "#/a%20b", true, false},
		{"json-pointer-uri-fragment", "/a", false, false},
		{"int32", 2147483647.0, true, false},
		{"int32", 2147483648.0, false, false},
		{"int32", 1.5, false, false},
		{"int32", "1.5", true, false},
		{"int64", 1e15, true, false},
		{"int64", 0.5, false, false},
		{"regex", "^a+$", true, false},
		{"regex", "(?i)a", false, false},
		{"regex", "(?=a)", false, true},
		{"regex", `^a\-b$`, false, true},
	}
	for _, r := range rows {
		o, err := compileOutput(map[string]any{"format": r.format})
		if err != nil {
			t.Fatal(err)
		}
		if got := o.validate(r.value) == nil; got != r.want {
			t.Errorf("%s %q: passes %v, want %v", r.format, r.value, got, r.want)
		}
	}

	type value struct {
		Format string `json:"format"`
		Value  any    `json:"value"`
	}
	var in []value
	for _, r := range rows {
		in = append(in, value{r.format, r.value})
	}
	var verdicts []bool
	runClient(t, "client_formats.mjs", in, &verdicts)
	if len(verdicts) != len(rows) {
		t.Fatalf("client_formats.mjs gave %d verdicts for %d rows", len(verdicts), len(rows))
	}
	for i, r := range rows {
		if verdicts[i] != (r.want || r.stricter) {
			t.Errorf("%s %q: the client says %v, the row %v (stricter: %v)", r.format, r.value, verdicts[i], r.want, r.stricter)
		}
	}
}
