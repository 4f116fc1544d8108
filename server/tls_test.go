package server_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opledger/ledger/internal/ledgertest"
	"github.com/opledger/ledger/server"
)

// TestNewTLSReloaderRefuses: files it cannot serve with are refused at
// start, naming what is wrong.
func TestNewTLSReloaderRefuses(t *testing.T) {
	dir := t.TempDir()
	pki := ledgertest.NewPKI(t, dir)
	_, cert, key := pki.Issue(t, "ledger", "ledger", true)
	notPEM := pki.NotPEM
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		files server.TLSFiles
		want  string
	}{
		{server.TLSFiles{Cert: cert}, "TLS needs both a certificate and a key file"},
		{server.TLSFiles{Cert: missing, Key: key}, "TLS certificate: open " + missing},
		{server.TLSFiles{Cert: key, Key: cert}, "TLS certificate: "},
		{server.TLSFiles{Cert: cert, Key: key, ClientCA: missing}, "client CA: open " + missing},
		{server.TLSFiles{Cert: cert, Key: key, ClientCA: notPEM}, "client CA " + notPEM + ": no PEM certificate in it"},
	} {
		if _, err := server.NewTLSReloader(tc.files); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error with %q", tc.files, err, tc.want)
		}
	}
}

// TestTLSReload: a reload serves the files' new certificate to new
// handshakes; one that fails leaves the previous certificate and client
// CA in force.
func TestTLSReload(t *testing.T) {
	dir := t.TempDir()
	pki := ledgertest.NewPKI(t, dir)
	first, cert, key := pki.Issue(t, "ledger", "ledger", true)
	second, cert2, key2 := pki.Issue(t, "ledger-2", "ledger", true)
	r, err := server.NewTLSReloader(server.TLSFiles{Cert: cert, Key: key, ClientCA: pki.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []struct {
		name    string
		change  func()
		failed  bool
		serving tls.Certificate
	}{
		{"as loaded", func() {}, false, first},
		{"a certificate that is no PEM", func() { write(t, cert, []byte("garbage")) }, true, first},
		{"a new certificate and key", func() { write(t, cert, read(t, cert2)); write(t, key, read(t, key2)) }, false, second},
		{"the client CA gone", func() { _ = os.Remove(pki.CAFile) }, true, second},
	} {
		step.change()
		if err := r.Reload(); (err != nil) != step.failed {
			t.Fatalf("%s: Reload = %v, want failed %v", step.name, err, step.failed)
		}
		cfg, err := r.Config().GetConfigForClient(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		leaf := cfg.Certificates[0].Leaf
		if string(cfg.Certificates[0].Certificate[0]) != string(step.serving.Certificate[0]) || cfg.ClientAuth != tls.VerifyClientCertIfGiven || cfg.ClientCAs == nil {
			t.Fatalf("%s: serving serial %v, client auth %v: want the step's certificate, and the client CA", step.name, leaf.SerialNumber, cfg.ClientAuth)
		}
		if !r.NotAfter().Equal(leaf.NotAfter.Truncate(1e9)) {
			t.Fatalf("%s: NotAfter %v, want %v", step.name, r.NotAfter(), leaf.NotAfter)
		}
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
