package sluice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func listen(t *testing.T, f *fakeAcceptor, o Options) *Listener {
	t.Helper()
	o.Acceptor = f.addr
	if o.Service == "" {
		o.Service = "api"
	}
	if o.Backoff == (Backoff{}) {
		o.Backoff = fastBackoff
	}
	ln, err := Listen(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestServesThroughAnUnchangedHTTPServer(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Instance: "api-1", Token: "s3cret"})
	serve(t, ln, hello)

	s := f.session()
	want := string(encodeRegistration(identity{"api", "default", "api-1", "s3cret"}, 1, 0))
	if string(s.hello) != want {
		t.Errorf("registration %q, want %q", s.hello, want)
	}
	for range 2 { // one session serves request after request
		resp, body := s.get(t, "/x")
		if resp.StatusCode != 200 || body != "hello\n" || resp.Close {
			t.Fatalf("got %d %q close=%v", resp.StatusCode, body, resp.Close)
		}
	}
}

func TestCapacityNRegistersNSessions(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 3})
	serve(t, ln, hello)
	for range 3 {
		s := f.session()
		if !strings.Contains(string(s.hello), "\r\nSluice-Capacity: 3\r\n") {
			t.Errorf("registration without the capacity: %q", s.hello)
		}
		if _, body := s.get(t, "/"); body != "hello\n" {
			t.Errorf("body %q", body)
		}
	}
	waitUntil(t, ln, "3 registered", func(l *Listener) bool { return l.registered == 3 })
	if st := ln.Status(); st.Registered != 3 || st.Capacity != 3 || st.LastError != nil {
		t.Errorf("status %+v", st)
	}
}

func TestProxyClosingASessionDialsAReplacement(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{})
	serve(t, ln, hello)
	first := f.session()
	first.get(t, "/")
	first.conn.Close()
	second := f.session()
	if _, body := second.get(t, "/"); body != "hello\n" {
		t.Errorf("body %q", body)
	}
	if n := f.registrations(); n != 2 {
		t.Errorf("%d registrations, want 2", n)
	}
}

// closedByTheService waits until the service has closed n of sessions (the fake proxy reads
// EOF) and returns those and the rest. Nothing is sent on them meanwhile; the reads left
// waiting on the rest are ended before it returns, so those sessions can be used again.
func closedByTheService(t *testing.T, sessions []*fakeSession, n int) (closed, open []*fakeSession) {
	t.Helper()
	type peeked struct {
		s   *fakeSession
		err error
	}
	results := make(chan peeked, len(sessions))
	for _, s := range sessions {
		go func() {
			_, err := s.br.Peek(1)
			results <- peeked{s, err}
		}()
	}
	deadline := time.After(testDeadline)
	for len(closed) < n {
		select {
		case r := <-results:
			if r.err != io.EOF {
				t.Fatalf("a session carried %v before any request", r.err)
			}
			closed = append(closed, r.s)
		case <-deadline:
			t.Fatalf("only %d of %d sessions were closed", len(closed), n)
		}
	}
	for _, s := range sessions {
		if !slices.Contains(closed, s) {
			open = append(open, s)
			s.conn.SetReadDeadline(time.Unix(1, 0)) // ends its Peek
		}
	}
	for range open {
		<-results
	}
	for _, s := range open {
		s.conn.SetReadDeadline(time.Time{})
	}
	return closed, open
}

func TestSetCapacityGrowsAndClosesIdleSurplusSessionsAtOnce(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 1})
	serve(t, ln, hello)
	sessions := []*fakeSession{f.session()}

	ln.SetCapacity(3)
	for range 2 {
		s := f.session()
		if !strings.Contains(string(s.hello), "\r\nSluice-Capacity: 3\r\n") {
			t.Errorf("grown registration carries %q", s.hello)
		}
		sessions = append(sessions, s)
	}
	waitUntil(t, ln, "3 registered", func(l *Listener) bool { return l.registered == 3 })

	ln.SetCapacity(1) // all three idle: two close at once, no request needed
	closed, open := closedByTheService(t, sessions, 2)
	for _, s := range closed {
		s.conn.Close()
	}
	waitUntil(t, ln, "the retired slots ended", func(l *Listener) bool {
		return l.running == 1 && l.registered == 1
	})
	// The one slot left holds its session: nothing can dial any more.
	if n := f.registrations(); n != 3 {
		t.Errorf("%d registrations, want 3 (retired sessions must not be re-dialed)", n)
	}
	if resp, body := open[0].get(t, "/"); resp.Close || body != "hello\n" {
		t.Errorf("the remaining session: %q, Connection: close = %v", body, resp.Close)
	}
}

// A session busy when the capacity shrinks closes right after its response: the handler had
// started before the shrink, so its response could not carry Connection: close.
func TestShrinkingClosesBusySurplusSessionsAfterTheirResponse(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 3})
	started, release := make(chan struct{}, 2), make(chan struct{})
	serve(t, ln, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			<-release
		}
		hello(w, r)
	})
	busy, idle := []*fakeSession{f.session(), f.session()}, f.session()
	errs := make(chan error, 2)
	for _, s := range busy {
		go func() {
			resp, body, err := s.roundTrip("/slow")
			if err == nil && (resp.StatusCode != 200 || body != "hello\n") {
				err = fmt.Errorf("got %d %q", resp.StatusCode, body)
			}
			errs <- err
		}()
		<-started
	}

	ln.SetCapacity(1)
	closedByTheService(t, []*fakeSession{idle}, 1) // the idle one closes at once
	close(release)
	for range busy {
		if err := <-errs; err != nil {
			t.Fatal(err) // no request is lost to the shrink
		}
	}
	closed, _ := closedByTheService(t, busy, 1) // one busy session, after its response
	closed[0].conn.Close()
	idle.conn.Close()
	waitUntil(t, ln, "one session left", func(l *Listener) bool {
		return l.running == 1 && l.registered == 1
	})
}

func TestShrinkingWhileBackingOffEndsTheSlot(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.setAnswer(func(int) string { return refusal(503) })
	ln := listen(t, f, Options{Capacity: 2})
	waitUntil(t, ln, "a refusal is recorded", func(l *Listener) bool { return l.lastErr != nil })
	ln.SetCapacity(0)
	waitUntil(t, ln, "every slot ended", func(l *Listener) bool { return l.running == 0 })
}

func TestUnauthorizedStopsForGoodUntilCapacityIsSetAgain(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.setAnswer(func(int) string { return refusal(401) })
	ln := listen(t, f, Options{Capacity: 2})
	serve(t, ln, hello)
	waitUntil(t, ln, "both slots gave up", func(l *Listener) bool { return l.running == 0 })

	var e *Error
	if err := ln.Status().LastError; !errors.As(err, &e) || e.Status != 401 || e.Retryable() {
		t.Fatalf("last error %v, want a permanent 401", err)
	}
	if n := f.registrations(); n != 2 {
		t.Errorf("%d registrations, want 2: a 401 is not retried", n)
	}

	f.setAnswer(func(int) string { return switched })
	ln.SetCapacity(2)
	f.session()
	f.session()
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 })
}

func TestUnavailableIsRetriedWithBackoff(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.setAnswer(func(n int) string {
		if n < 3 {
			return refusal(503)
		}
		return switched
	})
	ln := listen(t, f, Options{})
	serve(t, ln, hello)
	s := f.session()
	if _, body := s.get(t, "/"); body != "hello\n" {
		t.Errorf("body %q", body)
	}
	var e *Error
	if err := ln.Status().LastError; !errors.As(err, &e) || e.Status != 503 || !e.Retryable() {
		t.Errorf("last error %v, want a retryable 503", err)
	}
	if n := f.registrations(); n != 4 {
		t.Errorf("%d registrations, want 4", n)
	}
}

func TestShutdownDrainsAndWaitsForTheProxyToCloseEverySession(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 2, Instance: "api-1", Token: "s3cret"})
	started, release := make(chan struct{}), make(chan struct{})
	_, served := serve(t, ln, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		hello(w, r)
	})
	busy, idle := f.session(), f.session()

	type result struct {
		resp *http.Response
		body string
		err  error
	}
	inFlight := make(chan result, 1)
	go func() {
		resp, body, err := busy.roundTrip("/slow")
		inFlight <- result{resp, body, err}
	}()
	<-started

	// The proxy, told to drain, closes the idle session at once and the busy one after its
	// response.
	f.mu.Lock()
	f.onDrain = func() { idle.conn.Close() }
	f.mu.Unlock()
	shutdown := make(chan error, 1)
	go func() { shutdown <- ln.Shutdown(context.Background()) }()

	drain := <-f.drains
	if want := string(encodeDrain(identity{"api", "default", "api-1", "s3cret"})); string(drain) != want {
		t.Errorf("drain %q, want %q", drain, want)
	}
	waitUntil(t, ln, "the idle session is closed", func(l *Listener) bool { return l.registered == 1 })
	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned %v while a session was still open", err)
	default:
	}

	close(release)
	r := <-inFlight
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.resp.StatusCode != 200 || r.body != "hello\n" {
		t.Fatalf("in-flight request: %d %q", r.resp.StatusCode, r.body)
	}
	busy.conn.Close()
	if err := <-shutdown; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve returned %v, want net.ErrClosed", err)
	}
	if n := f.registrations(); n != 2 {
		t.Errorf("%d registrations, want 2: nothing re-dials during a drain", n)
	}
}

// http.Server.Shutdown closes its listeners; on its own it must drain and lose no request.
func TestServerShutdownAloneDrainsAndLosesNoRequest(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 2, Instance: "api-1"})
	started, release := make(chan struct{}), make(chan struct{})
	srv, served := serve(t, ln, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		hello(w, r)
	})
	busy, idle := f.session(), f.session()
	inFlight := make(chan error, 1)
	go func() {
		resp, body, err := busy.roundTrip("/slow")
		if err == nil && (resp.StatusCode != 200 || body != "hello\n") {
			err = fmt.Errorf("in-flight request: %d %q", resp.StatusCode, body)
		}
		inFlight <- err
	}()
	<-started
	f.mu.Lock()
	f.onDrain = func() { idle.conn.Close() }
	f.mu.Unlock()
	shutdown := make(chan error, 1)
	go func() { shutdown <- srv.Shutdown(context.Background()) }()

	<-f.drains
	waitUntil(t, ln, "the idle session is closed", func(l *Listener) bool { return l.registered == 1 })
	close(release)
	if err := <-inFlight; err != nil {
		t.Fatal(err)
	}
	busy.conn.Close() // the proxy closes a drained busy session after its response
	if err := <-shutdown; err != nil {
		t.Fatalf("srv.Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve returned %v, want http.ErrServerClosed", err)
	}
	if n := f.registrations(); n != 2 {
		t.Errorf("%d registrations, want 2: nothing re-dials during a drain", n)
	}
}

func TestCloseClosesEverySessionAtOnceWhenTheDrainIsRefused(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.mu.Lock()
	f.drainTo = refusal(503)
	f.mu.Unlock()
	ln := listen(t, f, Options{Capacity: 2})
	_, served := serve(t, ln, hello)
	a, b := f.session(), f.session()
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 })
	var e *Error
	if err := ln.Close(); !errors.As(err, &e) || e.Op != "drain" || e.Status != 503 {
		t.Errorf("Close returned %v, want the drain's 503", err)
	}
	for _, s := range []*fakeSession{a, b} {
		if _, err := io.ReadAll(s.conn); err != nil {
			t.Errorf("session not closed cleanly: %v", err)
		}
	}
	if err := <-served; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Serve returned %v, want net.ErrClosed", err)
	}
	waitUntil(t, ln, "every slot ended", func(l *Listener) bool { return l.running == 0 })
}

func TestTheListenContextEndingClosesEverySessionWithoutDraining(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := Listen(ctx, Options{Acceptor: f.addr, Service: "api", Capacity: 2, Backoff: fastBackoff})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, hello)
	a, b := f.session(), f.session()
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 })
	cancel()
	for _, s := range []*fakeSession{a, b} {
		if _, err := io.ReadAll(s.conn); err != nil {
			t.Errorf("session not closed cleanly: %v", err)
		}
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after the context ended: %v, want net.ErrClosed", err)
	}
	waitUntil(t, ln, "every slot ended", func(l *Listener) bool { return l.running == 0 })
	select {
	case <-f.drains:
		t.Error("the context's end sent a drain")
	default:
	}
	if n := f.registrations(); n != 2 {
		t.Errorf("%d registrations, want 2", n)
	}
}

func TestAHijackedSessionIsReplacedWhenItCloses(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{})
	serve(t, ln, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ws" {
			hello(w, r)
			return
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		buf.Flush()
		io.Copy(conn, buf) // echo until the peer closes
		conn.Close()
	})
	s := f.session()
	req, _ := http.NewRequest("GET", "http://svc/ws", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	req.Write(s.conn)
	resp, err := http.ReadResponse(s.br, req)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	s.conn.Write([]byte("ping"))
	got := make([]byte, 4)
	if _, err := io.ReadFull(s.br, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo %q %v", got, err)
	}
	s.conn.Close()
	if _, body := f.session().get(t, "/"); body != "hello\n" {
		t.Errorf("the replacement answered %q", body)
	}
}

func TestUnixSocketAcceptor(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "acceptor.sock")
	unixLn, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	f := newFakeAcceptor(t, unixLn, "unix:"+path)
	ln := listen(t, f, Options{})
	serve(t, ln, hello)
	if _, body := f.session().get(t, "/"); body != "hello\n" {
		t.Errorf("body %q", body)
	}
}

func TestInvalidOptionsAreRejectedBeforeAnyDial(t *testing.T) {
	t.Parallel()
	for _, o := range []Options{
		{Service: "api"},
		{Acceptor: "no-port", Service: "api"},
		{Acceptor: "unix:", Service: "api"},
		{Acceptor: "127.0.0.1:1", Service: "api", Capacity: -1},
		{Acceptor: "127.0.0.1:1", Service: "api", Backoff: Backoff{Jitter: 2}},
		{Acceptor: "127.0.0.1:1", Service: "api", Backoff: Backoff{Initial: 10e9, Max: 1e9}},
		{Acceptor: "127.0.0.1:1", Service: "api", HandshakeTimeout: -1},
	} {
		if _, err := Listen(t.Context(), o); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%+v: got %v, want ErrInvalidOptions", o, err)
		}
	}
}

func TestHandlerReportsTheClientAddressTheProxySaw(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Instance: "api-1"})
	serve(t, ln, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.RemoteAddr) })
	s := f.session()

	ask := func(header string) string {
		req, _ := http.NewRequest("GET", "http://svc/", nil)
		if header != "" {
			req.Header.Set("Sluice-Client-Addr", header)
		}
		req.Header.Set("X-Forwarded-For", "6.6.6.6")
		if err := req.Write(s.conn); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(s.br, req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := ask("[2001:db8::7]:4711"); got != "[2001:db8::7]:4711" {
		t.Errorf("RemoteAddr %q, want the proxy's Sluice-Client-Addr", got)
	}
	// Without a trusted value, the session's peer (the proxy), never a client's guess.
	proxy := s.conn.LocalAddr().String()
	for _, header := range []string{"", "6.6.6.6"} {
		if got := ask(header); got != proxy {
			t.Errorf("with %q: RemoteAddr %q, want the session's peer %q", header, got, proxy)
		}
	}
}

// Without Options.Logger, a refusal still reaches the application's log (slog.Default) with
// the acceptor's reason: a wrong token is never silent. Not parallel: it swaps slog.Default.
func TestRefusalsAreLoggedWithTheAcceptorsReasonByDefault(t *testing.T) {
	var logged bytes.Buffer
	var mu sync.Mutex
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	f := tcpAcceptor(t)
	body := "missing or invalid bearer token\n"
	f.setAnswer(func(int) string {
		return fmt.Sprintf("HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	})
	ln := listen(t, f, Options{})
	waitUntil(t, ln, "the slot gave up", func(l *Listener) bool { return l.running == 0 })
	if err := ln.Status().LastError; err == nil || !strings.Contains(err.Error(), "401: missing or invalid bearer token") {
		t.Errorf("last error %v, want the status and the acceptor's reason", err)
	}
	mu.Lock()
	defer mu.Unlock()
	out := logged.String()
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "missing or invalid bearer token") {
		t.Errorf("the default log has no refusal with its reason:\n%s", out)
	}
	if strings.Contains(out, "level=DEBUG") || strings.Contains(out, "level=INFO") {
		t.Errorf("the default log took records below warning:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
