package sluice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// logLines captures an instance's log records at every level.
type logLines struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced at every record
}

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
	return l.buf.Write(p)
}

// wait waits until a line contains every one of parts.
func (l *logLines) wait(t *testing.T, parts ...string) {
	t.Helper()
	deadline := time.After(testDeadline)
	for l.count(parts...) == 0 {
		l.mu.Lock()
		if l.changed == nil {
			l.changed = make(chan struct{})
		}
		changed := l.changed
		l.mu.Unlock()
		if l.count(parts...) > 0 {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no log line with %q:\n%s", parts, l)
		}
	}
}

// count is how many lines contain every one of parts.
func (l *logLines) count(parts ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.buf.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// probeNow makes the drained instance's next probe due at once, as if DrainedProbe had passed.
func probeNow(l *Listener) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextProbe = time.Now()
	l.notifyLocked()
}

// holdInstance drains the instance as an operator does: the proxy closes the sessions and
// answers 410 from then on. It closes first, then waits for the hold, then closes the rest,
// so exactly one slot meets the 410 before the hold.
func holdInstance(t *testing.T, f *fakeAcceptor, ln *Listener, sessions []*fakeSession) {
	t.Helper()
	f.setAnswer(func(int) string { return refusal(410) })
	sessions[0].conn.Close()
	waitUntil(t, ln, "the instance is held", func(l *Listener) bool { return l.held != nil })
	for _, s := range sessions[1:] {
		s.conn.Close()
	}
	waitUntil(t, ln, "no session left", func(l *Listener) bool { return l.registered == 0 })
}

// Issue 28.8: after `sluice ctl drain` the slots stop, one registration at a time probes
// every DrainedProbe, and `sluice ctl resume` brings the instance back with no one touching the
// service.
func TestADrainedInstanceProbesOnceAtATimeAndComesBackWhenResumed(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	var logs logLines
	ln := listen(t, f, Options{Capacity: 3, Instance: "api-1", DrainedProbe: time.Hour, Logger: logs.logger()})
	serve(t, ln, hello)
	holdInstance(t, f, ln, []*fakeSession{f.session(), f.session(), f.session()})
	if n := f.registrations(); n != 4 {
		t.Fatalf("%d registrations, want 4: only the slot that met the 410 dialed", n)
	}
	st := ln.Status()
	var e *Error
	if !st.Drained || !errors.As(st.LastError, &e) || !e.Drained() {
		t.Fatalf("status %+v, want Drained with the 410", st)
	}

	for probes := 1; probes <= 2; probes++ { // each due probe is one registration, answered 410
		probeNow(ln)
		waitUntil(t, ln, "the probe was answered", func(l *Listener) bool {
			return !l.probing && f.registrations() == 4+probes
		})
		if n := f.registrations(); n != 4+probes {
			t.Fatalf("%d registrations after %d probes, want %d", n, probes, 4+probes)
		}
	}

	f.setAnswer(func(int) string { return switched }) // sluice ctl resume
	probeNow(ln)
	for range 3 {
		if _, body := f.session().get(t, "/"); body != "hello\n" {
			t.Fatalf("body %q", body)
		}
	}
	waitUntil(t, ln, "3 registered again", func(l *Listener) bool { return l.registered == 3 })
	if ln.Status().Drained {
		t.Error("still drained after the probe registered")
	}
	if n := logs.count("level=WARN"); n != 1 || logs.count("level=WARN", "drained") != 1 {
		t.Errorf("%d warnings, want one that says drained:\n%s", n, &logs)
	}
	if n := logs.count("level=INFO", "resumed"); n != 1 {
		t.Errorf("%d lines say resumed, want 1:\n%s", n, &logs)
	}
	if n := logs.count("level=ERROR"); n != 0 {
		t.Errorf("%d error lines:\n%s", n, &logs)
	}
}

func TestSettingTheCapacityWhileDrainedDialsAtOnce(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 2, DrainedProbe: time.Hour})
	serve(t, ln, hello)
	holdInstance(t, f, ln, []*fakeSession{f.session(), f.session()})
	f.setAnswer(func(int) string { return switched })
	ln.SetCapacity(2)
	f.session()
	f.session()
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 && l.held == nil })
}

func TestShutdownOfADrainedInstanceDrainsAndReturns(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 2, Instance: "api-1", DrainedProbe: time.Hour})
	serve(t, ln, hello)
	holdInstance(t, f, ln, []*fakeSession{f.session(), f.session()})
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown of a drained instance: %v", err)
	}
	<-f.drains
	if n := f.registrations(); n != 3 {
		t.Errorf("%d registrations, want 3", n)
	}
}

// Issue 28.14: a proxy restart is one warning and one info line with the outage's length and
// failed dials, not a line per slot per attempt.
func TestAnOutageIsOneWarningAndOneLineWhenItEnds(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	var logs logLines
	ln := listen(t, f, Options{Capacity: 4, Logger: logs.logger()})
	serve(t, ln, hello)
	sessions := []*fakeSession{f.session(), f.session(), f.session(), f.session()}
	const failures = 12
	f.setAnswer(func(n int) string {
		if n < 4+failures {
			return refusal(503)
		}
		return switched
	})
	for _, s := range sessions {
		s.conn.Close()
	}
	for range 4 {
		f.session()
	}
	waitUntil(t, ln, "4 registered again", func(l *Listener) bool { return l.registered == 4 })
	if n := logs.count("level=WARN"); n != 1 || logs.count("level=WARN", "503") != 1 {
		t.Errorf("%d warnings, want one with the reason:\n%s", n, &logs)
	}
	// A dial of another slot may fail after one registered again: it belongs to the outage
	// that ended and is not counted, so 9 to 12 of the 12 failures are in the line.
	ended := 0
	for n := failures - 3; n <= failures; n++ {
		ended += logs.count("level=INFO", "again", fmt.Sprintf("failed_dials=%d", n), "outage=")
	}
	if ended != 1 || logs.count("again") != 1 {
		t.Errorf("%d lines end the outage with its failed dials, want 1:\n%s", ended, &logs)
	}
}

func TestARefusalAndACapacityChangeAreOneLineEach(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	f.setAnswer(func(int) string { return refusal(401) })
	var logs logLines
	ln := listen(t, f, Options{Capacity: 3, Logger: logs.logger()})
	waitUntil(t, ln, "every slot gave up", func(l *Listener) bool { return l.running == 0 })
	if n := logs.count("level=ERROR", "401"); n != 1 {
		t.Errorf("%d error lines for three slots refused, want 1:\n%s", n, &logs)
	}
	f.setAnswer(func(int) string { return switched })
	ln.SetCapacity(2)
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 })
	for _, change := range []string{"old=0 new=3", "old=3 new=2"} {
		if n := logs.count("level=INFO", "capacity", change); n != 1 {
			t.Errorf("%d lines say %q, want 1:\n%s", n, change, &logs)
		}
	}
}

// The same through the public API only: after a 410, the instance registers again by itself
// once the proxy accepts it (an operator ran `sluice ctl resume`), without SetCapacity.
func TestResumeBringsTheInstanceBackWithoutTouchingTheService(t *testing.T) {
	t.Parallel()
	f := tcpAcceptor(t)
	ln := listen(t, f, Options{Capacity: 2, DrainedProbe: 5 * time.Millisecond})
	serve(t, ln, hello)
	a, b := f.session(), f.session()
	f.setAnswer(func(int) string { return refusal(410) })
	a.conn.Close()
	b.conn.Close()
	waitUntil(t, ln, "the 410 is seen and no session is left", func(l *Listener) bool {
		return isDrained(l.lastErr) && l.registered == 0
	})
	f.setAnswer(func(int) string { return switched })
	for range 2 {
		if _, body := f.session().get(t, "/"); body != "hello\n" {
			t.Fatalf("body %q", body)
		}
	}
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 })
}

// The real proxy: `sluice ctl drain` (the admin API's drain) holds the instance out, and
// `sluice ctl resume` brings it back within DrainedProbe, with one warning and one info line.
func TestRealProxyDrainHoldsTheInstanceUntilResume(t *testing.T) {
	t.Parallel()
	node := startSluice(t, sluiceConfig("127.0.0.1", 0))
	var logs logLines
	ln, err := Listen(context.Background(), Options{
		Acceptor: node.Acceptor, Service: "api", Instance: "go-drained", Token: sluiceToken,
		Capacity: 2, DrainedProbe: 100 * time.Millisecond, Backoff: fastBackoff, Logger: logs.logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, hello)
	waitUntil(t, ln, "2 registered", func(l *Listener) bool { return l.registered == 2 })
	const instance = "/clusters/api/instances/go-drained"
	if status := node.admin(instance + "/drain"); status != 200 {
		t.Fatalf("drain: %d", status)
	}
	waitUntil(t, ln, "held with no session", func(l *Listener) bool { return l.held != nil && l.registered == 0 })
	if status := node.admin(instance + "/resume"); status != 200 {
		t.Fatalf("resume: %d", status)
	}
	waitUntil(t, ln, "2 registered again", func(l *Listener) bool { return l.held == nil && l.registered == 2 })
	if n := logs.count("level=WARN"); n != 1 || logs.count("level=WARN", "drained") != 1 {
		t.Errorf("%d warnings, want one that says drained:\n%s", n, &logs)
	}
	if n := logs.count("level=INFO", "resumed"); n != 1 {
		t.Errorf("%d lines say resumed, want 1:\n%s", n, &logs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}
