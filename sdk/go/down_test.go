package sluice

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"
)

// When a node of many is down (protocol/README.md "The control link"): at once when its link
// closed and its address refuses connections (its process is gone), after NodeGrace when it
// is only silent or slow (a hung node, a partition, a hot restart), and without a warning when
// it said DRAINING first.

// A node whose link closed and whose address then refuses connections is gone, so it is down
// at once, not after NodeGrace: its share moves to the others, and its idle sessions there
// (which nothing will retire) are closed by the SDK.
func TestANodeThatRefusesConnectionsIsDownAtOnce(t *testing.T) {
	t.Parallel()
	a, b, c := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	var logs logLines
	// A grace longer than the test may last: only the refusal can take c down.
	ln := listenMany(t, Options{Capacity: 6, NodeGrace: time.Hour, Logger: logs.logger()}, a, b, c)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b, c}, 2, 2, 2)
	stranded := c.open()
	c.ln.Close() // nothing listens at c any more: a connect is refused
	c.closeLinks()
	// It takes milliseconds; a second is the protocol's "at once", and generous.
	waitWithin(t, ln, time.Second, "c is down and its share dialed at the others", func(l *Listener) bool {
		st, _ := nodeOf(l, c.addr)
		return st.State == "down" && !st.Live && held(l, a.addr)+held(l, b.addr) == 6
	})
	closedByTheService(t, stranded, 2)
	waitHolding(t, ln, []*fakeNode{a, b, c}, 3, 3, 0)
	if n := logs.count("level=WARN", "node down", "refuses connections", "node="+c.addr); n != 1 {
		t.Errorf("%d lines say c is down because it refuses connections, want 1:\n%s", n, &logs)
	}
}

// A hot restart replaces the process behind a node's acceptor and passes the listening socket
// on: the link closes, and the next one is taken but answered only once the new process is
// up, maybe after a timed-out dial. That is no refusal: the node stays live and keeps its
// sessions, and nothing moves.
func TestAHotRestartKeepsTheNodeAndItsSessions(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	var logs logLines
	ln := listenMany(t, Options{
		Capacity: 4, NodeGrace: time.Hour, HandshakeTimeout: 100 * time.Millisecond, Logger: logs.logger(),
	}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	kept := b.open()
	b.mu.Lock()
	b.stall = true
	registered := b.registered
	b.mu.Unlock()
	b.closeLinks()
	// The second dial taken means the first one timed out: the SDK dials one link at a time.
	b.waitFor("two link dials while the new process starts", func(n *fakeNode) bool { return len(n.stalled) >= 2 })
	if st := statusOf(t, ln, b.addr); !st.Live || st.State != "reconnecting" || st.Held != 2 {
		t.Errorf("b while its new process starts: %+v", st)
	}
	b.unstall()
	waitUntil(t, ln, "b's link is up again", func(l *Listener) bool {
		st, _ := nodeOf(l, b.addr)
		return st.Live && st.State == ""
	})
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	if closed, _ := closedWithin(t, kept); len(closed) != 0 {
		t.Errorf("%d of b's sessions closed by a hot restart", len(closed))
	}
	b.mu.Lock()
	dialed := b.registered - registered
	b.mu.Unlock()
	if dialed != 0 || logs.count("node down") != 0 {
		t.Errorf("%d sessions dialed again at b; the log:\n%s", dialed, &logs)
	}
}

// A hung node: its link falls silent (no heartbeat) and the dials that follow are taken but
// never answered. That is silence, not death: the node keeps its share and its sessions for
// NodeGrace.
func TestAHungNodeKeepsItsShareForItsGrace(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	var logs logLines
	ln := listenMany(t, Options{
		Capacity: 4, NodeGrace: time.Hour, HandshakeTimeout: 100 * time.Millisecond, Logger: logs.logger(),
		silence: 100 * time.Millisecond, // the fake nodes send one DEMAND per link: silent after it
	}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	kept := b.open()
	b.mu.Lock()
	b.stall = true
	b.mu.Unlock()
	b.waitFor("three link dials after the silence", func(n *fakeNode) bool { return len(n.stalled) >= 3 })
	if st := statusOf(t, ln, b.addr); !st.Live || st.State != "reconnecting" || st.Held != 2 {
		t.Errorf("b after two timed-out dials: %+v", st)
	}
	if closed, _ := closedWithin(t, kept); len(closed) != 0 {
		t.Errorf("%d of b's sessions closed within its grace", len(closed))
	}
	if n := logs.count("node down"); n != 0 {
		t.Errorf("b is down within its grace:\n%s", &logs)
	}
}

// After NodeGrace without a link a hung node is down: its share moves and its idle sessions
// are closed by the SDK.
func TestAHungNodeIsDownAfterItsGrace(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	var logs logLines
	ln := listenMany(t, Options{
		Capacity: 4, NodeGrace: 50 * time.Millisecond, HandshakeTimeout: 50 * time.Millisecond, Logger: logs.logger(),
	}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	stranded := b.open()
	b.mu.Lock()
	b.stall = true
	b.mu.Unlock()
	b.closeLinks()
	waitUntil(t, ln, "b is down", func(l *Listener) bool {
		st, _ := nodeOf(l, b.addr)
		return st.State == "down"
	})
	closedByTheService(t, stranded, 2)
	waitHolding(t, ln, []*fakeNode{a, b}, 4, 0)
	if n := logs.count("level=WARN", "node down: no control link within NodeGrace", "node="+b.addr); n != 1 {
		t.Errorf("%d lines say b is down after its grace, want 1:\n%s", n, &logs)
	}
}

// A node that said DRAINING is expected to go away: whether its address then refuses
// connections (it stopped) or its dials hang past NodeGrace, the SDK says so in one info line,
// with no warning (neither "node down" nor an outage).
func TestADrainedNodeThatGoesAwayIsNoWarning(t *testing.T) {
	t.Parallel()
	for _, how := range []struct {
		name  string
		grace time.Duration
	}{{"refused", time.Hour}, {"hung", 50 * time.Millisecond}} {
		t.Run(how.name, func(t *testing.T) {
			t.Parallel()
			a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
			var logs logLines
			ln := listenMany(t, Options{
				Capacity: 4, NodeGrace: how.grace, HandshakeTimeout: 50 * time.Millisecond, Logger: logs.logger(),
			}, a, b)
			serve(t, ln, hello)
			waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
			b.send("DRAINING")
			waitUntil(t, ln, "b is draining", func(l *Listener) bool { return l.nodeAt(b.addr).draining })
			b.closeSessions(2) // as a stopping node closes those it no longer needs
			waitHolding(t, ln, []*fakeNode{a, b}, 4, 0)
			b.mu.Lock()
			if how.name == "refused" {
				b.ln.Close()
			} else {
				b.stall = true
			}
			b.mu.Unlock()
			b.closeLinks()
			waitUntil(t, ln, "b is gone", func(l *Listener) bool { return l.nodeAt(b.addr).down })
			if n := logs.count("level=WARN"); n != 0 {
				t.Errorf("%d warnings after a drained node went away:\n%s", n, &logs)
			}
			if n := logs.count("level=INFO", "the draining node is gone", "node="+b.addr); n != 1 {
				t.Errorf("%d lines say the drained node is gone, want 1:\n%s", n, &logs)
			}
			if st := statusOf(t, ln, b.addr); st.State != "draining" || st.Live {
				t.Errorf("b: %+v", st)
			}
		})
	}
}

// A link the instance closes itself (the node left DNS, or the Listener shut down) is not
// lost: no grace begins, so no "node down" warning follows NodeGrace later.
func TestALinkTheInstanceClosesTakesNoNodeDown(t *testing.T) {
	t.Parallel()
	a := newFakeNode(t, "127.0.0.2", 0)
	port := a.ln.Addr().(*net.TCPAddr).Port
	b := newFakeNode(t, "127.0.0.3", port)
	r := &fakeResolver{}
	r.set("127.0.0.2", "127.0.0.3")
	var logs logLines
	ln := listenMany(t, Options{
		Acceptor: "dns:nodes.test:" + strconv.Itoa(port), Capacity: 2, Resolver: r,
		ResolveInterval: 10 * time.Millisecond, NodeGrace: time.Millisecond, Logger: logs.logger(),
	})
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 1, 1)
	ln.mu.Lock()
	stays, leaves := ln.nodeAt(a.addr), ln.nodeAt(b.addr)
	ln.mu.Unlock()

	r.set("127.0.0.2")
	waitUntil(t, ln, "b is forgotten and its link ended", func(l *Listener) bool {
		return l.nodeAt(b.addr) == nil && leaves.link == nil
	})
	waitHolding(t, ln, []*fakeNode{a}, 2) // no dial under way when the drain is sent
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	waitUntil(t, ln, "a's link ended", func(*Listener) bool { return stays.link == nil })
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for _, n := range []*node{leaves, stays} {
		if !n.lostAt.IsZero() || n.down {
			t.Errorf("%s: a grace began after the instance closed its link", n)
		}
	}
	if n := logs.count("node down"); n != 0 {
		t.Errorf("%d lines say a node is down:\n%s", n, &logs)
	}
}
