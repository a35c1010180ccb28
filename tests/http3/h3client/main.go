// Command h3client sends one request over HTTP/3 with quic-go's http3 client, an independent
// implementation, and prints the answer: the status on the first line, then the body. It
// trusts the CA given with -ca (the test's own), and fails on anything but HTTP/3.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/quic-go/quic-go/http3"
)

func main() {
	method := flag.String("method", "GET", "request method")
	body := flag.String("data", "", "request body (sent with Content-Length when not empty)")
	ca := flag.String("ca", "", "PEM file of the CA to trust")
	name := flag.String("servername", "localhost", "TLS server name (SNI)")
	header := flag.String("header", "", "one extra field, name:value")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: h3client [flags] URL")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *method, *body, *ca, *name, *header); err != nil {
		fmt.Fprintln(os.Stderr, "h3client:", err)
		os.Exit(1)
	}
}

func run(url, method, body, caPath, name, header string) error {
	pem, err := os.ReadFile(caPath)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("no certificate in %s", caPath)
	}
	transport := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: name}}
	defer transport.Close()
	client := &http.Client{Transport: transport, Timeout: 20 * time.Second}
	var reader io.Reader
	if body != "" {
		reader = bytes.NewBufferString(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, reader)
	if err != nil {
		return err
	}
	if n, v, ok := strings.Cut(header, ":"); ok {
		req.Header.Set(n, v)
	}
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	got, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	if res.ProtoMajor != 3 {
		return fmt.Errorf("answered over %s, not HTTP/3", res.Proto)
	}
	fmt.Printf("%d\n%s", res.StatusCode, got)
	return nil
}
