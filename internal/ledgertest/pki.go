package ledgertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a certificate authority of a test, valid for an hour, whose
// certificates are written as PEM files into its directory.
type PKI struct {
	// Pool holds the CA's certificate.
	Pool *x509.CertPool
	// CAFile is the CA's certificate, as PEM.
	CAFile string
	// NotPEM is a file beside it that holds no PEM block, for the tests
	// of files refused.
	NotPEM string

	dir    string
	ca     *x509.Certificate
	key    *ecdsa.PrivateKey
	serial int64
}

// NewPKI returns a new CA whose files go into dir.
func NewPKI(tb testing.TB, dir string) *PKI {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	p := &PKI{Pool: x509.NewCertPool(), dir: dir, ca: ca, key: key, serial: 1}
	p.Pool.AddCert(ca)
	p.CAFile = p.write(tb, "ca.pem", "CERTIFICATE", der)
	p.NotPEM = filepath.Join(dir, "not.pem")
	if err := os.WriteFile(p.NotPEM, []byte("not a certificate\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// Issue returns a certificate the CA signs for cn (and the URI SANs uris):
// a server's for 127.0.0.1 when server is true, a client's otherwise. It
// writes it and its key as name.pem and name-key.pem, and returns their
// paths.
func (p *PKI) Issue(tb testing.TB, name, cn string, server bool, uris ...string) (cert tls.Certificate, certFile, keyFile string) {
	tb.Helper()
	return p.IssueUntil(tb, name, cn, server, time.Now().Add(time.Hour), uris...)
}

// IssueUntil is Issue with a certificate that expires at notAfter.
func (p *PKI) IssueUntil(tb testing.TB, name, cn string, server bool, notAfter time.Time, uris ...string) (cert tls.Certificate, certFile, keyFile string) {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			tb.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.key)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certFile = p.write(tb, name+".pem", "CERTIFICATE", der)
	keyFile = p.write(tb, name+"-key.pem", "PRIVATE KEY", keyDER)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, certFile, keyFile
}

// write writes der as a PEM block of kind into the file name of the
// CA's directory, and returns its path.
func (p *PKI) write(tb testing.TB, name, kind string, der []byte) string {
	tb.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}
