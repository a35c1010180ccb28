package sluice

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

// selfSigned makes a certificate for 127.0.0.1 that serves as its own CA and as a client
// certificate.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice-test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestMutualTLSAcceptor(t *testing.T) {
	t.Parallel()
	cert, pool := selfSigned(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
	}
	f := newFakeAcceptor(t, tls.NewListener(tcp, server), tcp.Addr().String())
	// No ServerName: it is taken from the acceptor's host, 127.0.0.1.
	ln := listen(t, f, Options{TLS: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}})
	serve(t, ln, hello)
	s := f.session()
	if _, body := s.get(t, "/"); body != "hello\n" {
		t.Errorf("body %q", body)
	}
	if state := s.conn.(*tls.Conn).ConnectionState(); len(state.PeerCertificates) == 0 {
		t.Error("the service presented no client certificate")
	}
}

func TestAnUntrustedAcceptorIsATLSError(t *testing.T) {
	t.Parallel()
	cert, _ := selfSigned(t)
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeAcceptor(t, tls.NewListener(tcp, &tls.Config{Certificates: []tls.Certificate{cert}}), tcp.Addr().String())
	ln := listen(t, f, Options{TLS: &tls.Config{RootCAs: x509.NewCertPool()}})
	waitUntil(t, ln, "an error is recorded", func(l *Listener) bool { return l.lastErr != nil })
	var e *Error
	if err := ln.Status().LastError; !asError(err, &e) || e.Kind != KindTLS || !e.Retryable() {
		t.Errorf("last error %v, want a retryable TLS error", err)
	}
}
