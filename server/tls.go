package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
)

// TLSFiles name the PEM files of the service's TLS: its certificate chain
// and key, and optionally the CA that signs client certificates (mTLS).
type TLSFiles struct {
	Cert, Key string
	ClientCA  string
}

// TLSReloader serves TLS from files it can reload while serving: new
// handshakes use the new certificate and client CA, open connections keep
// theirs.
type TLSReloader struct {
	files    TLSFiles
	cur      atomic.Pointer[tls.Config]
	notAfter atomic.Int64 // Unix seconds: when the served certificate expires
}

// NewTLSReloader loads the files.
func NewTLSReloader(files TLSFiles) (*TLSReloader, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("TLS needs both a certificate and a key file")
	}
	r := &TLSReloader{files: files}
	return r, r.Reload()
}

// Reload reads the files again; on error the previous configuration stays.
func (r *TLSReloader) Reload() error {
	cert, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key)
	if err != nil {
		return fmt.Errorf("TLS certificate: %w", err)
	}
	leaf := cert.Leaf
	if leaf == nil { // GODEBUG=x509keypairleaf=0
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("TLS certificate: %w", err)
		}
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if r.files.ClientCA != "" {
		pem, err := os.ReadFile(r.files.ClientCA)
		if err != nil {
			return fmt.Errorf("client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("client CA %s: no PEM certificate in it", r.files.ClientCA)
		}
		// A client may present a certificate (mapped to a tenant by the
		// credentials file) or an API key; a certificate it presents must
		// verify.
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	r.cur.Store(cfg)
	r.notAfter.Store(leaf.NotAfter.Unix())
	return nil
}

// NotAfter is when the served certificate expires.
func (r *TLSReloader) NotAfter() time.Time { return time.Unix(r.notAfter.Load(), 0) }

// Config returns the tls.Config to serve with.
func (r *TLSReloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load(), nil
		},
	}
}
