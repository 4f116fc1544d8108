package main

import (
	"crypto/tls"
	"io"
	"net"
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

// TestHTTPConnections: the HTTP listener's connections count towards
// --max-connections (one over it is closed as soon as it is accepted, as
// on the gRPC listener), a request whose body does not come is cut off at
// the read timeout instead of holding its connection, and a connection
// left idle is closed, on the metrics listener too.
func TestHTTPConnections(t *testing.T) {
	t.Run("max-connections", func(t *testing.T) {
		_, _, out := start(t, insecure.NewCredentials(), "--http-listen", "127.0.0.1:0", "--max-connections", "3")
		addr, err := ledgertest.ListenAddr(out.String, "HTTP API serving", nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var held []net.Conn
		for range 3 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		get := func() error {
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			resp, err := c.Get("http://" + addr + "/v1/caller")
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := get(); err == nil {
			t.Fatal("a request over --max-connections (3 held, and the API's own) was served")
		}
		for _, c := range held {
			c.Close()
		}
		ledgertest.Await(t, "a request once the held connections closed", func() bool { return get() == nil })
	})
	t.Run("read timeout", func(t *testing.T) {
		_, _, out := startTuned(t, insecure.NewCredentials(), func(c *config) { c.httpReadTimeout = 300 * time.Millisecond },
			"--http-listen", "127.0.0.1:0")
		addr, err := ledgertest.ListenAddr(out.String, "HTTP API serving", nil, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// 100 bytes announced, 10 sent.
		if _, err := io.WriteString(c, "POST /v1/operations/slow:reserve HTTP/1.1\r\nHost: "+addr+"\r\nContent-Length: 100\r\n\r\n{\"tool\":\"t"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("the connection of a body that did not come was still open: %v", err)
		}
	})
	t.Run("idle timeout", func(t *testing.T) {
		_, _, out := startTuned(t, insecure.NewCredentials(), func(c *config) { c.httpIdleTimeout = 300 * time.Millisecond },
			"--http-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
		for _, l := range []struct{ msg, path string }{{"HTTP API serving", "/v1/caller"}, {"metrics serving", "/metrics"}} {
			addr, err := ledgertest.ListenAddr(out.String, l.msg, nil, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if err := ledgertest.IdleClosed(addr, l.path); err != nil {
				t.Errorf("%s: %v", l.msg, err)
			}
		}
	})
}
