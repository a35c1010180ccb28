package grpctest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
)

// TestHTTPHandlerOverH2Sessions: a net/http handler behind an http.Server that speaks h2c
// only (Protocols with SetUnencryptedHTTP2), on HTTP/2 sessions, reached through Sluice by a
// plain HTTP/1.1 client; ln.Handler gives it the client's address as r.RemoteAddr.
func TestHTTPHandlerOverH2Sessions(t *testing.T) {
	n := startSluice(t)
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: protocols}
	listen(t, n, 1, 4, func(ln *sluice.Listener) {
		srv.Handler = ln.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			fmt.Fprintf(w, "%s %d %s %s", r.Method, r.ProtoMajor, r.RemoteAddr, body)
		}))
		go srv.Serve(ln)
	})
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

// TestHTTPShrinkOverH2Sessions: SetCapacity below the sessions registered, while every stream
// of both sessions is busy, loses no response (each 300 KB, so flow control is at work), and
// afterwards the one session left takes no more than its 2 streams at once.
func TestHTTPShrinkOverH2Sessions(t *testing.T) {
	n := startSluice(t)
	var inFlight, most atomic.Int32
	var mu sync.Mutex
	hold := make(chan struct{})
	arrived := make(chan struct{}, 16)
	body := strings.Repeat("y", 300000)
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		mu.Lock()
		wait := hold
		mu.Unlock()
		arrived <- struct{}{}
		if r.URL.Path == "/hold" {
			<-wait
		} else {
			time.Sleep(100 * time.Millisecond)
		}
		io.WriteString(w, body)
	})
	srv := &http.Server{Protocols: protocols}
	ln := listen(t, n, 2, 2, func(ln *sluice.Listener) {
		srv.Handler = ln.Handler(handler)
		go srv.Serve(ln)
	})
	t.Cleanup(func() { srv.Close() })

	client := &http.Client{Timeout: testDeadline, Transport: &http.Transport{MaxConnsPerHost: 16, MaxIdleConnsPerHost: 16}}
	get := func(path string, errc chan<- error) {
		resp, err := client.Get("http://" + n.HTTP + path)
		if err == nil {
			var b []byte
			b, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && (resp.StatusCode != 200 || string(b) != body) {
				err = fmt.Errorf("GET %s: %d, %d bytes", path, resp.StatusCode, len(b))
			}
		}
		errc <- err
	}
	errc := make(chan error, 16)
	for range 4 {
		go get("/hold", errc)
	}
	for range 4 {
		select {
		case <-arrived:
		case <-time.After(testDeadline):
			t.Fatal("the 4 requests are not all in the handler (2 sessions × 2 streams)")
		}
	}
	ln.SetCapacity(1)
	mu.Lock()
	close(hold)
	mu.Unlock()
	for range 4 {
		if err := <-errc; err != nil {
			t.Errorf("a request in flight at the shrink: %v", err)
		}
	}
	deadline := time.After(testDeadline)
	for {
		st, changed := ln.Watch()
		if st.Registered == 1 {
			break
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d sessions registered after the shrink to 1", st.Registered)
		}
	}
	most.Store(0)
	for range 6 {
		go get("/slow", errc)
	}
	for range 6 {
		if err := <-errc; err != nil {
			t.Errorf("after the shrink: %v", err)
		}
	}
	if m := most.Load(); m != 2 {
		t.Errorf("after the shrink the handler had at most %d requests at once, want 2", m)
	}
}
