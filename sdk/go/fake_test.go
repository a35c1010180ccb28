package sluice

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

const (
	switched = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: sluice-session/1\r\n\r\n"
	// switchedH2 takes an HTTP/2 session's registration.
	switchedH2 = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: sluice-session/1\r\nSluice-Protocol: h2\r\n\r\n"
	drained    = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\nConnection: close\r\n\r\ndraining\n"
)

func refusal(status int) string {
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status, http.StatusText(status))
}

// fakeAcceptor is the acceptor and the proxy in one: it answers registrations (101 unless
// answer says otherwise) and then drives each session as the proxy does, with HTTP/1.1
// requests written on it and responses read with http.ReadResponse.
type fakeAcceptor struct {
	t        *testing.T
	addr     string // for Options.Acceptor
	sessions chan *fakeSession
	drains   chan []byte

	mu      sync.Mutex
	hellos  [][]byte           // every registration head, in arrival order
	answer  func(n int) string // the answer to registration number n (0-based)
	onDrain func()             // nil: close every session, as the proxy closes idle ones
	live    []net.Conn         // every registered session
	drainTo string             // the answer to a drain; "" means 200
}

// newFakeAcceptor serves on ln until the test ends.
func newFakeAcceptor(t *testing.T, ln net.Listener, addr string) *fakeAcceptor {
	f := &fakeAcceptor{
		t:        t,
		addr:     addr,
		sessions: make(chan *fakeSession, 64),
		drains:   make(chan []byte, 4),
		answer:   func(int) string { return switched },
	}
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			conns = append(conns, conn)
			f.mu.Unlock()
			go f.handshake(conn)
		}
	}()
	return f
}

func tcpAcceptor(t *testing.T) *fakeAcceptor {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return newFakeAcceptor(t, ln, ln.Addr().String())
}

func (f *fakeAcceptor) handshake(conn net.Conn) {
	br := bufio.NewReader(conn)
	head, err := readHead(br)
	if err != nil {
		conn.Close()
		return
	}
	if bytes.HasPrefix(head, []byte("POST /.sluice/v1/drain ")) {
		f.mu.Lock()
		onDrain, live, answer := f.onDrain, f.live, f.drainTo
		f.mu.Unlock()
		if answer != "" {
			conn.Write([]byte(answer))
			conn.Close()
			return
		}
		if onDrain != nil {
			onDrain()
		} else {
			for _, c := range live {
				c.Close()
			}
		}
		f.drains <- head
		conn.Write([]byte(drained))
		conn.Close()
		return
	}
	f.mu.Lock()
	n := len(f.hellos)
	f.hellos = append(f.hellos, head)
	answer := f.answer(n)
	f.mu.Unlock()
	if _, err := conn.Write([]byte(answer)); err != nil || (answer != switched && answer != switchedH2) {
		conn.Close()
		return
	}
	f.mu.Lock()
	f.live = append(f.live, conn)
	f.mu.Unlock()
	f.sessions <- &fakeSession{conn: conn, br: br, hello: head}
}

func (f *fakeAcceptor) setAnswer(answer func(n int) string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer = answer
}

// registrations is how many registrations arrived so far.
func (f *fakeAcceptor) registrations() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.hellos)
}

// session waits for the next registered session.
func (f *fakeAcceptor) session() *fakeSession {
	f.t.Helper()
	select {
	case s := <-f.sessions:
		return s
	case <-time.After(testDeadline):
		f.t.Fatal("no session registered")
		return nil
	}
}

// testDeadline only turns a hang into a failure; the only durations tests assert are
// waitWithin's generous bounds on what the protocol says happens at once.
const testDeadline = 20 * time.Second

// fakeSession is one registered session, seen from the proxy.
type fakeSession struct {
	conn  net.Conn
	br    *bufio.Reader
	hello []byte
}

// get sends one request as the proxy does and reads the whole response.
func (s *fakeSession) get(t *testing.T, path string) (*http.Response, string) {
	t.Helper()
	resp, body, err := s.roundTrip(path)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// roundTrip is get for goroutines other than the test's.
func (s *fakeSession) roundTrip(path string) (*http.Response, string, error) {
	req, _ := http.NewRequest("GET", "http://svc"+path, nil)
	if err := req.Write(s.conn); err != nil {
		return nil, "", fmt.Errorf("write request: %w", err)
	}
	resp, err := http.ReadResponse(s.br, req)
	if err != nil {
		return nil, "", fmt.Errorf("read response: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, "", fmt.Errorf("read body: %w", err)
	}
	return resp, string(body), nil
}

// waitUntil waits, without polling, until cond holds on the listener's state under its lock.
func waitUntil(t *testing.T, l *Listener, what string, cond func(l *Listener) bool) {
	t.Helper()
	waitWithin(t, l, testDeadline, what, cond)
}

// waitWithin is waitUntil within bound, for what the protocol says happens at once.
func waitWithin(t *testing.T, l *Listener, bound time.Duration, what string, cond func(l *Listener) bool) {
	t.Helper()
	deadline := time.After(bound)
	for {
		l.mu.Lock()
		ok, changed := cond(l), l.changed
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("not within %v: %s", bound, what)
		}
	}
}

// serve starts an http.Server on ln with h wrapped by ln.Handler; it is shut down at cleanup.
func serve(t *testing.T, ln *Listener, h http.HandlerFunc) (*http.Server, chan error) {
	srv := &http.Server{Handler: ln.Handler(h)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv, served
}

func hello(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	io.WriteString(w, "hello\n")
}

// fastBackoff keeps retry tests quick; no test depends on its values.
var fastBackoff = Backoff{Initial: time.Millisecond, Max: 4 * time.Millisecond}
