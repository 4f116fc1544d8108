package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestProtect: without credentials, on a loopback listener, a Host that
// is not loopback is refused (DNS rebinding), whatever the method, and so
// is a write a browser sent from another origin. Requests no browser sent,
// a browser's from the ledger's own origin, and all with credentials pass.
func TestProtect(t *testing.T) {
	var served atomic.Int32
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { served.Add(1) })
	anon := httptest.NewServer(Protect(ok, true))
	t.Cleanup(anon.Close)
	keyed := httptest.NewServer(Protect(ok, false))
	t.Cleanup(keyed.Close)
	crossSite := map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://attacker.example"}
	for _, c := range []struct {
		name      string
		anonymous bool
		method    string
		host      string
		header    map[string]string
		refused   bool
	}{
		{"a client's write", true, "POST", "", nil, false},
		{"a client's write to localhost", true, "POST", "localhost:8080", nil, false},
		{"a client's write to [::1]", true, "POST", "[::1]:8080", nil, false},
		{"a write from the page's own origin", true, "POST", "", map[string]string{"Sec-Fetch-Site": "same-origin"}, false},
		{"a write from another site", true, "POST", "", crossSite, true},
		{"a write from another origin, an older browser", true, "POST", "", map[string]string{"Origin": "https://attacker.example"}, true},
		{"a read from another site", true, "GET", "", crossSite, false},
		{"a write from another site, with credentials", false, "POST", "", crossSite, false},
		{"a rebound name", true, "GET", "attacker.example:8080", nil, true},
		{"a proxy's Host, with credentials", false, "GET", "ledger.example", nil, false},
		{"a rebound name on the page's own origin", true, "POST", "attacker.example", map[string]string{"Sec-Fetch-Site": "same-origin"}, true},
		{"a name that merely starts like localhost", true, "GET", "localhost.attacker.example", nil, true},
	} {
		srv := keyed
		if c.anonymous {
			srv = anon
		}
		req, err := http.NewRequest(c.method, srv.URL+"/v1/operations/x:reserve", strings.NewReader(`{"tool":"t.x"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		if c.host != "" {
			req.Host = c.host
		}
		before := served.Load()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var st struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Details []struct {
				Reason string `json:"reason"`
			} `json:"details"`
		}
		_ = json.Unmarshal(b, &st)
		refused := resp.StatusCode == http.StatusForbidden && st.Code == 7 && len(st.Details) == 1 && st.Details[0].Reason == "PERMISSION_DENIED" && st.Message != ""
		if ran := served.Load() > before; refused != c.refused || ran == c.refused {
			t.Errorf("%s: %d %s (served: %v), want refused %v", c.name, resp.StatusCode, b, ran, c.refused)
		}
	}
}
