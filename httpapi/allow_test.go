package httpapi_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/redistest"
)

// TestMethodsAllowed: a method a path does not take is 405 with the
// methods it does take in Allow (RFC 9110 15.5.6), a form POSTed to a GET
// path among them; HEAD is a GET without the body; a path the API does
// not have names no methods.
func TestMethodsAllowed(t *testing.T) {
	a := start(t, redistest.Embedded(t))
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
		body         bool
	}{
		{"DELETE", "/v1/operations/wf-1:refund", 405, "GET, HEAD", true},
		{"PUT", "/v1/runs", 405, "GET, HEAD", true},
		{"GET", "/v1/operations:reserve", 405, "POST", true},
		{"DELETE", "/v1/runs/r-1:end", 405, "GET, HEAD, POST", true}, // GET reads a run named "r-1:end"
		{"POST", "/v1/operations:lookup", 405, "GET, HEAD", true},
		{"POST", "/v1/runs", 405, "GET, HEAD", true},
		{"POST", "/v1/operations/wf-1", 405, "GET, HEAD", true},
		{"PATCH", "/v1/caller", 405, "GET, HEAD", true},
		{"HEAD", "/v1/operations:reserve", 405, "POST", false},
		{"HEAD", "/v1/caller", 200, "", false},
		{"HEAD", "/v1/operations/never", 404, "", false},
		{"HEAD", "/v1/openapi.json", 200, "", false},
		{"GET", "/v1/operation/wf-1", 404, "", true},
		{"DELETE", "/v1/nothing", 404, "", true},
	} {
		req, err := http.NewRequest(c.method, a.url+c.path, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+a.keys["viewer"])
		// A form, which grpc-gateway would otherwise route as the GET of
		// its path.
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow || (len(b) > 0) != c.body {
			t.Errorf("%s %s: %d, Allow %q, %d bytes of body; want %d, Allow %q, a body %v",
				c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), len(b), c.status, c.allow, c.body)
		}
	}
}
