package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/opledger/ledger/internal/ledgertest"
)

// TestHTTPListen: --http-listen serves the HTTP/JSON API over the same
// service, in plaintext on loopback and with the gRPC listener's TLS files;
// a plaintext request to the TLS listener gets no answer of the API.
func TestHTTPListen(t *testing.T) {
	post := func(t *testing.T, c *http.Client, url string) (int, string) {
		t.Helper()
		resp, err := c.Post(url+"/v1/operations/wf-1:refund:reserve", "application/json",
			strings.NewReader(`{"tool":"payments.refund","params":{"amount":5},"holder":"h-1"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	t.Run("plaintext", func(t *testing.T) {
		_, _, out := start(t, insecure.NewCredentials(), "--http-listen", "127.0.0.1:0")
		addr, err := ledgertest.ListenAddr(out.String, "HTTP API serving", nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code, body := post(t, http.DefaultClient, "http://"+addr); code != 200 || !strings.Contains(body, `"decision":"DECISION_EXECUTE"`) {
			t.Fatalf("Reserve over HTTP = %d %s", code, body)
		}
		// Without --auth-file, what a page of another site could make a
		// browser send is refused (httpapi.Protect).
		for _, c := range []struct{ method, path, host, site string }{
			{"POST", "/v1/operations/wf-2:reserve", "", "cross-site"},
			{"GET", "/v1/operations/wf-1:refund", "attacker.example", ""},
			{"GET", "/console/", "attacker.example", ""},
		} {
			req, _ := http.NewRequest(c.method, "http://"+addr+c.path, strings.NewReader(`{"tool":"payments.refund","holder":"h-2"}`))
			if c.host != "" {
				req.Host = c.host
			}
			if c.site != "" {
				req.Header.Set("Sec-Fetch-Site", c.site)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s %s (Host %q, Sec-Fetch-Site %q) = %d, want 403", c.method, c.path, c.host, c.site, resp.StatusCode)
			}
		}
	})
	t.Run("tls", func(t *testing.T) {
		certFile, keyFile, pool := serverCert(t, t.TempDir())
		tlsCreds := credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		_, _, out := start(t, tlsCreds, "--tls-cert", certFile, "--tls-key", keyFile, "--http-listen", "127.0.0.1:0")
		addr, err := ledgertest.ListenAddr(out.String, "HTTP API serving", nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		if code, body := post(t, c, "https://"+addr); code != 200 || !strings.Contains(body, `"decision":"DECISION_EXECUTE"`) {
			t.Fatalf("Reserve over HTTPS = %d %s", code, body)
		}
		if code, _ := post(t, http.DefaultClient, "http://"+addr); code != http.StatusBadRequest {
			t.Fatalf("plaintext to the TLS listener = %d, want Go's 400 for HTTP to an HTTPS server", code)
		}
	})
}
