package sluice

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// HTTP/2 sessions against the fake acceptor: the fake proxy speaks HTTP/2 with prior
// knowledge on each session (net/http's own client), as Sluice does.

// h2Client is an HTTP/2 client over one registered session, as Sluice is its client.
func h2Client(s *fakeSession) *http.Client {
	var once sync.Once
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Timeout: testDeadline, Transport: &http.Transport{
		Protocols: protocols,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			var conn net.Conn
			once.Do(func() { conn = s.conn })
			if conn == nil {
				return nil, errors.New("the session's connection is taken")
			}
			return conn, nil
		},
	}}
}

// h2Server is an http.Server that takes HTTP/2 with prior knowledge only, as the README says.
func h2Server(t *testing.T, ln *Listener, h http.Handler) *http.Server {
	protocols := new(http.Protocols)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: protocols}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv
}

// TestH2SessionCarriesConcurrentRequests: Streams registers with Sluice-Protocol: h2 and
// Sluice-Streams; on the session, an unchanged http.Server speaking HTTP/2 serves several
// requests at once, and ln.Handler sets each r.RemoteAddr from its own Sluice-Client-Addr.
func TestH2SessionCarriesConcurrentRequests(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.setAnswer(func(int) string { return switchedH2 })
	ln := listen(t, f, Options{Instance: "g-1", Token: "s3cret", Capacity: 1, Streams: 4})
	const n = 4
	arrived := make(chan struct{}, n)
	var mu sync.Mutex
	release := make(chan struct{})
	h2Server(t, ln, ln.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		wait := release
		mu.Unlock()
		arrived <- struct{}{}
		<-wait // every request is in the handler at once: all on one session
		fmt.Fprintf(w, "%d %s", r.ProtoMajor, r.RemoteAddr)
	})))

	s := f.session()
	want := "GET /.sluice/v1/session HTTP/1.1\r\nHost: sluice\r\nConnection: Upgrade\r\nUpgrade: sluice-session/1\r\n" +
		"Sluice-Service: api\r\nSluice-Slice: default\r\nSluice-Instance: g-1\r\nAuthorization: Bearer s3cret\r\n" +
		"Sluice-Capacity: 1\r\nSluice-Protocol: h2\r\nSluice-Streams: 4\r\n\r\n"
	if string(s.hello) != want {
		t.Errorf("registration %q, want %q", s.hello, want)
	}
	waitUntil(t, ln, "registered", func(l *Listener) bool { return l.registered == 1 })
	if ln.served(s) {
		t.Error("the session counts as served before any request")
	}
	client := h2Client(s)
	// One request first opens the client's connection (the session), which the others share.
	close(release)
	if resp, err := client.Get("http://svc/first"); err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("first request: %v, %v", resp, err)
	} else {
		resp.Body.Close()
	}
	<-arrived
	mu.Lock()
	release = make(chan struct{})
	mu.Unlock()
	bodies := make(chan string, n)
	for i := range n {
		go func() {
			req, _ := http.NewRequest("GET", "http://svc/x", nil)
			req.Header.Set(clientAddrHeader, fmt.Sprintf("198.51.100.%d:4000", i+1))
			resp, err := client.Do(req)
			if err != nil {
				bodies <- err.Error()
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			bodies <- fmt.Sprintf("%d %s", resp.ProtoMajor, body)
		}()
	}
	for range n {
		select {
		case <-arrived:
		case b := <-bodies:
			t.Fatalf("a response before every request was in the handler: %s", b)
		case <-time.After(testDeadline):
			t.Fatal("the requests are not all in the handler at once")
		}
	}
	mu.Lock()
	close(release)
	mu.Unlock()
	got := map[string]bool{}
	for range n {
		got[<-bodies] = true // the client's timeout ends each
	}
	for i := range n {
		if w := fmt.Sprintf("2 2 198.51.100.%d:4000", i+1); !got[w] {
			t.Errorf("no response %q among %v", w, got)
		}
	}
	if !ln.served(s) {
		t.Error("the session does not count as served after its requests")
	}
	if f.registrations() != 1 {
		t.Errorf("%d registrations, want 1", f.registrations())
	}
}

// served reports whether the Listener's session for the fake's s counts as served.
func (l *Listener) served(s *fakeSession) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.live {
		if c.Conn.RemoteAddr().String() == s.conn.LocalAddr().String() {
			return c.served.Load()
		}
	}
	return false
}

// TestH2AcceptorWithoutHTTP2StopsTheSlot: an acceptor that answers an HTTP/2 registration
// with a plain 101 does not take HTTP/2 sessions; the slot stops with an error that says so
// and is not retried.
func TestH2AcceptorWithoutHTTP2StopsTheSlot(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 2, Streams: 8})
	waitUntil(t, ln, "both slots stopped", func(l *Listener) bool { return l.running == 0 })
	st := ln.Status()
	var e *Error
	if !errors.As(st.LastError, &e) || e.Kind != KindUnsupported || e.Retryable() ||
		!strings.Contains(e.Error(), "does not take HTTP/2 sessions") {
		t.Fatalf("LastError %v", st.LastError)
	}
	if got := f.registrations(); got != 2 {
		t.Errorf("%d registrations, want 2 (one per slot, none retried)", got)
	}
	if st.Registered != 0 {
		t.Errorf("%d registered", st.Registered)
	}
}

// TestH2OptionsStreams: Streams is 0 or 1 to 1000.
func TestH2OptionsStreams(t *testing.T) {
	t.Parallel()
	for streams, valid := range map[int]bool{-1: false, 0: true, 1: true, 1000: true, 1001: false} {
		ln, err := Listen(t.Context(), Options{Acceptor: "127.0.0.1:1", Service: "api", Streams: streams})
		if (err == nil) != valid || (err != nil && !errors.Is(err, ErrInvalidOptions)) {
			t.Errorf("Streams %d: %v, want valid %v", streams, err, valid)
		}
		if ln != nil {
			ln.abort()
		}
	}
}

// TestH2StreamsFollowsFrames: the preface, SETTINGS, WINDOW_UPDATE and PING Sluice sends
// after the 101 open no stream, in whatever pieces they arrive; HEADERS open one, and the
// server's END_STREAM or either side's RST_STREAM close it.
func TestH2StreamsFollowsFrames(t *testing.T) {
	t.Parallel()
	frame := func(typ, flags byte, stream uint32, payload int) []byte {
		b := make([]byte, frameHeaderLen+payload)
		b[0], b[1], b[2], b[3], b[4] = byte(payload>>16), byte(payload>>8), byte(payload), typ, flags
		binary.BigEndian.PutUint32(b[5:], stream)
		return b
	}
	opening := append([]byte(clientPreface), frame(0x4, 0, 0, 18)...) // SETTINGS
	opening = append(opening, frame(0x8, 0, 0, 4)...)                 // WINDOW_UPDATE
	opening = append(opening, frame(0x6, 0, 0, 8)...)                 // PING
	// A payload holding a HEADERS frame's bytes is skipped, not read.
	copy(opening[len(clientPreface)+frameHeaderLen:], frame(frameHeaders, 0, 1, 0))
	var requests []byte
	requests = append(requests, frame(frameHeaders, 0x4|flagEndStream, 1, 40)...) // GET
	requests = append(requests, frame(frameHeaders, 0x4, 3, 50)...)               // POST
	requests = append(requests, frame(frameData, flagEndStream, 3, 1000)...)      // its body
	requests = append(requests, frame(frameHeaders, 0x4, 5, 20)...)
	requests = append(requests, frame(frameRSTStream, 0, 5, 4)...) // the client left
	for _, size := range []int{1, 2, 5, 9, 24, 100, 1 << 20} {
		h := newH2Streams()
		feed := func(b []byte, f func([]byte)) {
			for i := 0; i < len(b); i += size {
				f(b[i:min(i+size, len(b))])
			}
		}
		feed(opening, h.read)
		if h.requested || len(h.open) != 0 {
			t.Fatalf("pieces of %d: the opening frames opened %v", size, h.open)
		}
		feed(requests, h.read)
		if !h.requested || len(h.open) != 2 {
			t.Fatalf("pieces of %d: open %v, want streams 1 and 3", size, h.open)
		}
		var answers []byte
		answers = append(answers, frame(0x4, 0, 0, 12)...)                          // SETTINGS
		answers = append(answers, frame(frameHeaders, 0x4, 1, 30)...)               // 200
		answers = append(answers, frame(frameData, 0, 1, 5000)...)                  // body
		answers = append(answers, frame(frameData, flagEndStream, 1, 0)...)         // its end
		answers = append(answers, frame(frameHeaders, 0x4|flagEndStream, 3, 10)...) // trailers-only
		feed(answers[:len(answers)-frameHeaderLen-10], h.wrote)
		if _, ok := h.open[3]; !ok || len(h.open) != 1 {
			t.Fatalf("pieces of %d: open %v, want stream 3", size, h.open)
		}
		feed(answers[len(answers)-frameHeaderLen-10:], h.wrote)
		if len(h.open) != 0 {
			t.Fatalf("pieces of %d: open %v after every answer", size, h.open)
		}
	}
}

// TestH2ShrinkWhileBusyLosesNoResponse: a shrink that owes a retirement while an HTTP/2
// session's request is in the handler closes the session after the response, whole.
func TestH2ShrinkWhileBusyLosesNoResponse(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.setAnswer(func(int) string { return switchedH2 })
	ln := listen(t, f, Options{Capacity: 1, Streams: 2})
	arrived, release := make(chan struct{}), make(chan struct{})
	body := strings.Repeat("z", 200000)
	h2Server(t, ln, ln.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		io.WriteString(w, body)
	})))
	s := f.session()
	waitUntil(t, ln, "registered", func(l *Listener) bool { return l.registered == 1 })
	client := h2Client(s)
	type result struct {
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := client.Get("http://svc/slow")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{string(b), err}
	}()
	<-arrived
	ln.SetCapacity(0)
	close(release)
	r := <-done
	if r.err != nil || r.body != body {
		t.Fatalf("response %d bytes, %v; want %d bytes", len(r.body), r.err, len(body))
	}
	waitUntil(t, ln, "the session closed", func(l *Listener) bool { return l.registered == 0 })
	if got := f.registrations(); got != 1 {
		t.Errorf("%d registrations, want 1 (the retired session is not replaced)", got)
	}
}
