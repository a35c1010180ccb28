package grpctest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// TestHTTPHandlerOverH2Sessions: a net/http handler behind an http.Server that speaks h2c
// only (Protocols with SetUnencryptedHTTP2), on HTTP/2 sessions, reached through Sluice by a
// plain HTTP/1.1 client; ln.Handler gives it the client's address as r.RemoteAddr.
func TestHTTPHandlerOverH2Sessions(t *testing.T) {
	n := startSluice(t)
	ln := listen(t, n, 1, 4)
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: protocols, Handler: ln.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		fmt.Fprintf(w, "%s %d %s %s", r.Method, r.ProtoMajor, r.RemoteAddr, body)
	}))}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	var mu sync.Mutex
	var local []string
	client := &http.Client{Timeout: testDeadline, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				mu.Lock()
				local = append(local, conn.LocalAddr().String())
				mu.Unlock()
			}
			return conn, err
		},
	}}
	for i, method := range []string{"GET", "POST", "POST"} {
		body := strings.Repeat("x", i*70000)
		req, _ := http.NewRequest(method, "http://"+n.HTTP+"/echo", strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		want := fmt.Sprintf("%s 2 %s %s", method, local[len(local)-1], body)
		mu.Unlock()
		if resp.StatusCode != 200 || resp.ProtoMajor != 1 || string(got) != want {
			t.Errorf("%s: %d HTTP/%d %.80q, want 200 HTTP/1 %.80q", method, resp.StatusCode, resp.ProtoMajor, got, want)
		}
	}
}
