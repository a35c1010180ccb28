package sluice

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Many nodes (protocol/README.md "Many nodes"), against fake nodes. Every test runs with
// sumBelow: the sessions held across the nodes never exceed the capacity.

func TestManyNodesSplitTheCapacityAndDeclareIt(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	ln := listenMany(t, Options{Capacity: 4, Instance: "api-1", Token: "s3cret"}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	for _, n := range []*fakeNode{a, b} {
		n.waitFor("CAPACITY 4", func(n *fakeNode) bool { return slices.Contains(n.lines, "CAPACITY 4") })
		for _, s := range n.open() {
			if _, body := s.get(t, "/"); body != "hello\n" {
				t.Errorf("body %q", body)
			}
		}
	}
	st := ln.Status()
	if len(st.Nodes) != 2 || st.Nodes[0].Address != a.addr || !st.Nodes[0].Live || st.Nodes[0].Target != 2 || st.Nodes[1].Held != 2 {
		t.Errorf("status %+v", st.Nodes)
	}
	ln.SetCapacity(6)
	for _, n := range []*fakeNode{a, b} {
		n.waitFor("CAPACITY 6", func(n *fakeNode) bool { return slices.Contains(n.lines, "CAPACITY 6") })
	}
	waitHolding(t, ln, []*fakeNode{a, b}, 3, 3)
}

// A node whose DEMAND shows a queue gets more sessions; the other is asked to RETIRE (the
// SDK does not close a live node's sessions itself), and only once it has closed one does the
// instance dial the node that asked.
func TestTheSplitFollowsDemandThroughRetire(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	b.manual = true
	var logs logLines
	ln := listenMany(t, Options{Capacity: 4, Logger: logs.logger()}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	a.mu.Lock()
	registered := a.registered
	a.mu.Unlock()

	a.send("DEMAND 2 10 0 2") // two in flight, ten queued: a's quota is 3
	b.waitFor("RETIRE 1", func(n *fakeNode) bool { return slices.Contains(n.lines, "RETIRE 1") })
	// Nothing moves until b closes one: its sessions stay open, a gets no new one.
	closed, _ := closedWithin(t, b.open())
	if len(closed) != 0 || a.registered != registered {
		t.Fatalf("before b retired one: %d of b's sessions closed by the SDK, %d new at a", len(closed), a.registered-registered)
	}
	waitUntil(t, ln, "b's retirement counted", func(l *Listener) bool {
		return held(l, b.addr) == 1 && held(l, a.addr) == 2
	})
	b.mu.Lock()
	b.closeLocked(1)
	b.mu.Unlock()
	waitHolding(t, ln, []*fakeNode{a, b}, 3, 1)
	ln.mu.Lock()
	failures := ln.nodeAt(b.addr).failures
	ln.mu.Unlock()
	if failures != 0 {
		t.Errorf("the session b retired counted as %d failures: b backs off", failures)
	}
	// At most one line a second: the one that says so may come a little later. The demand
	// is smoothed, half way from the first report's 0 to 12.
	logs.wait(t, "level=INFO", "rebalance", a.addr+" live d=6.00", "t=3", b.addr+" -1")
}

// closedWithin reports which sessions the service has closed by now (EOF already there) and
// which are open, without waiting for either.
func closedWithin(t *testing.T, sessions []*fakeSession) (closed, open []*fakeSession) {
	t.Helper()
	for _, s := range sessions {
		s.conn.SetReadDeadline(time.Now())
		_, err := s.br.Peek(1)
		s.conn.SetReadDeadline(time.Time{})
		if err != nil && !errors.Is(err, errDeadline) && !strings.Contains(err.Error(), "timeout") {
			closed = append(closed, s)
		} else {
			open = append(open, s)
		}
	}
	return closed, open
}

var errDeadline = errors.New("i/o timeout")

func TestADeadNodesShareMovesToTheOthers(t *testing.T) {
	t.Parallel()
	a, b, c := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	var logs logLines
	ln := listenMany(t, Options{Capacity: 6, NodeGrace: 50 * time.Millisecond, Logger: logs.logger()}, a, b, c)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b, c}, 2, 2, 2)
	c.kill()
	waitUntil(t, ln, "c is down", func(l *Listener) bool {
		st, _ := nodeOf(l, c.addr)
		return st.State == "down" && !st.Live
	})
	waitHolding(t, ln, []*fakeNode{a, b, c}, 3, 3, 0)
	if n := logs.count("level=WARN", "node down", c.addr); n != 1 {
		t.Errorf("%d lines say c is down, want 1:\n%s", n, &logs)
	}
	if n := logs.count("level=WARN", c.addr); n != 2 {
		t.Errorf("%d warnings about c, want 2 (unreachable, down):\n%s", n, &logs)
	}
}

// A node that says DRAINING gets no new session, no RETIRE and no close from the SDK: the
// node closes its sessions itself once the requests it queued are answered, and each one it
// closes is dialed at the others (issue 46: closing them here answered those requests 503).
func TestADrainingNodeClosesItsSessionsAndEachOneMoves(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	ln := listenMany(t, Options{Capacity: 4}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	leaving := b.open()
	before, registered := len(b.serviceLines()), b.registered
	b.send("DRAINING")
	waitUntil(t, ln, "b is draining", func(l *Listener) bool {
		st, _ := nodeOf(l, b.addr)
		return st.State == "draining" && !st.Live
	})
	// Its sessions still answer what the node sends them, as they would its queue.
	for _, s := range leaving {
		if resp, body := s.get(t, "/"); resp.StatusCode != 200 || resp.Close || body != "hello\n" {
			t.Fatalf("a request at the draining node: %d close=%v %q", resp.StatusCode, resp.Close, body)
		}
	}
	b.closeSessions(1)
	waitHolding(t, ln, []*fakeNode{a, b}, 3, 1)
	b.closeSessions(1)
	waitHolding(t, ln, []*fakeNode{a, b}, 4, 0)
	for _, line := range b.serviceLines()[before:] {
		if strings.HasPrefix(line, "RETIRE") {
			t.Errorf("b was asked to %s; a draining node closes its sessions itself", line)
		}
	}
	if b.registered != registered {
		t.Errorf("%d registrations at b after DRAINING, want none", b.registered-registered)
	}
}

// A busy session at a node that drains is not closed after its response: the node may hand
// it the next request of its queue, and closes it when none waits; no request is lost.
func TestABusySessionAtADrainingNodeServesOnUntilTheNodeClosesIt(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	ln := listenMany(t, Options{Capacity: 2}, a, b)
	started, release := make(chan struct{}), make(chan struct{})
	serve(t, ln, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		hello(w, r)
	})
	waitHolding(t, ln, []*fakeNode{a, b}, 1, 1)
	busy := b.open()[0]
	done := make(chan *http.Response, 1)
	go func() {
		resp, _, err := busy.roundTrip("/slow")
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-started
	b.send("DRAINING")
	waitUntil(t, ln, "b is draining", func(l *Listener) bool {
		st, _ := nodeOf(l, b.addr)
		return st.State == "draining"
	})
	close(release)
	if resp := <-done; resp == nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("the busy request: %+v, want 200 without Connection: close", resp)
	}
	// The next request the node queued gets the same session.
	if resp, _ := busy.get(t, "/"); resp.StatusCode != 200 {
		t.Fatalf("the queued request: %d, want 200", resp.StatusCode)
	}
	b.closeSessions(1)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 0)
}

// An acceptor without control links (400) counts as live with demand 1; it cannot be asked to
// retire, so the SDK closes its surplus itself.
func TestANodeWithoutControlLinksGetsAnEvenShare(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	b.controlTo = refusal(400)
	ln := listenMany(t, Options{Capacity: 4}, a, b)
	serve(t, ln, hello)
	// a reports no demand, b counts as 1: one each, and the other two by demand.
	waitHolding(t, ln, []*fakeNode{a, b}, 1, 3)
	if st := statusOf(t, ln, b.addr); !st.Live || st.Demand != 1 {
		t.Errorf("b: %+v", st)
	}
}

// A node that counts on another instance for its floor (FLOOR 0, sent only because the link
// said Sluice-Split: service) gets no session while it has no demand; a new link that says no
// FLOOR (an older node after a restart) asks for the floor again.
func TestANodeThatSaysFloor0KeepsNoSessionForThisInstance(t *testing.T) {
	t.Parallel()
	a, b, c := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	a.firstDemand = "DEMAND 5 0 0 0"
	b.floor, c.floor = "FLOOR 0", "FLOOR 0"
	ln := listenMany(t, Options{Capacity: 4}, a, b, c)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b, c}, 4, 0, 0)

	b.mu.Lock()
	b.floor = ""
	b.mu.Unlock()
	b.closeLinks()
	waitHolding(t, ln, []*fakeNode{a, b, c}, 3, 1, 0)
	if got := a.serviceLines(); !slices.Contains(got, "RETIRE 1") {
		t.Errorf("a's lines %q: want a RETIRE 1 to make room for b's floor", got)
	}
}

// dns: re-resolution joins a node that appears and leaves one that disappears: with its link
// up, the leaving node is asked to retire every session, and its link closes once it holds
// none.
func TestDNSReResolutionJoinsAndLeavesNodes(t *testing.T) {
	t.Parallel()
	a := newFakeNode(t, "127.0.0.2", 0)
	port := a.ln.Addr().(*net.TCPAddr).Port
	b, c := newFakeNode(t, "127.0.0.3", port), newFakeNode(t, "127.0.0.4", port)
	r := &fakeResolver{}
	r.set("127.0.0.3", "127.0.0.2")
	ln := listenMany(t, Options{
		Acceptor: "dns:nodes.test:" + strconv.Itoa(port), Capacity: 4, Resolver: r,
		ResolveInterval: 10 * time.Millisecond,
	})
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2) // listed sorted: a (.2) before b (.3)
	if st := ln.Status().Nodes; len(st) != 2 || st[0].Host != "nodes.test" {
		t.Errorf("status %+v", st)
	}

	// No demand anywhere: 4/3 each. The first listed of the two above it gives one to c.
	r.set("127.0.0.2", "127.0.0.3", "127.0.0.4")
	waitHolding(t, ln, []*fakeNode{a, b, c}, 1, 2, 1)

	r.set("127.0.0.2", "127.0.0.4")
	b.waitFor("RETIRE 2", func(n *fakeNode) bool { return slices.Contains(n.lines, "RETIRE 2") })
	waitHolding(t, ln, []*fakeNode{a, c}, 2, 2)
	waitUntil(t, ln, "b is forgotten", func(l *Listener) bool { return l.nodeAt(b.addr) == nil })
	b.waitFor("b's link closed", func(n *fakeNode) bool {
		_, err := n.links[len(n.links)-1].Write([]byte("DEMAND 0 0 0 0\n"))
		return err != nil
	})
}

// Issue 46: a node back under a new address (a restarted pod) was found only at the next
// ResolveInterval. A node lost is a change suspected: the name is resolved again within
// seconds, however long the interval.
func TestALostNodeMakesTheNameResolveAgainSoon(t *testing.T) {
	t.Parallel()
	a := newFakeNode(t, "127.0.0.2", 0)
	port := a.ln.Addr().(*net.TCPAddr).Port
	b := newFakeNode(t, "127.0.0.3", port)
	r := &fakeResolver{}
	r.set("127.0.0.2")
	ln := listenMany(t, Options{
		Acceptor: "dns:nodes.test:" + strconv.Itoa(port), Capacity: 4, Resolver: r,
		ResolveInterval: time.Hour,
	})
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a}, 4)
	r.set("127.0.0.3") // a's replacement, at a new address
	a.kill()
	waitWithin(t, ln, 5*time.Second, "b found and holding every session",
		func(l *Listener) bool { return l.nodeAt(b.addr) != nil && l.nodeAt(b.addr).holding() == 4 })
}

// Names that fail to resolve keep the nodes known.
func TestAFailedResolutionKeepsTheNodes(t *testing.T) {
	t.Parallel()
	a := newFakeNode(t, "127.0.0.2", 0)
	port := a.ln.Addr().(*net.TCPAddr).Port
	r := &fakeResolver{}
	r.set("127.0.0.2")
	ln := listenMany(t, Options{Acceptor: "dns:nodes.test:" + strconv.Itoa(port), Capacity: 2, Resolver: r, ResolveInterval: 5 * time.Millisecond})
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a}, 2)
	r.mu.Lock()
	r.err = errors.New("no such host")
	r.mu.Unlock()
	waitUntil(t, ln, "the failure is seen", func(l *Listener) bool {
		return l.lastErr != nil && strings.Contains(l.lastErr.Error(), "no such host")
	})
	if st := statusOf(t, ln, a.addr); !st.Live || st.Held != 2 {
		t.Errorf("a after a failed resolution: %+v", st)
	}
}

// The sum guarantee while the split moves sessions back and forth, N shrinks and grows, and a
// node dies: sumBelow checks it at every change; here the handler also counts its own
// concurrency while requests keep every session busy.
func TestTheSumGuaranteeHoldsUnderSkewFlipsShrinkGrowAndDeath(t *testing.T) {
	t.Parallel()
	a, b, c := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	ln := listenMany(t, Options{Capacity: 6, NodeGrace: 20 * time.Millisecond}, a, b, c)
	var inFlight, most atomic.Int32
	serve(t, ln, func(w http.ResponseWriter, r *http.Request) {
		now := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
		}
		hello(w, r)
	})
	all := []*fakeNode{a, b, c}
	waitHolding(t, ln, all, 2, 2, 2)
	load := func() { // one request on every open session, all at once
		var wg sync.WaitGroup
		for _, n := range all {
			for _, s := range n.open() {
				wg.Go(func() { s.roundTrip("/") })
			}
		}
		wg.Wait()
	}
	a.send("DEMAND 2 30 0 2")
	waitHolding(t, ln, all, 4, 1, 1)
	load()
	// As nodes send DEMAND while it changes (every 100 ms), not once: the split follows the
	// smoothed demand, which one sample each moves only half way.
	for range 5 {
		a.send("DEMAND 0 0 0 4")
		c.send("DEMAND 1 40 0 1")
		time.Sleep(100 * time.Millisecond)
	}
	waitUntil(t, ln, "c gets the most", func(l *Listener) bool { return held(l, c.addr) >= 3 })
	load()
	ln.SetCapacity(3)
	load()
	ln.SetCapacity(9)
	load()
	b.kill()
	waitUntil(t, ln, "b is down and the others hold 9", func(l *Listener) bool {
		st, _ := nodeOf(l, b.addr)
		return st.State == "down" && held(l, a.addr)+held(l, c.addr) == 9
	})
	load()
	if m := most.Load(); m > 9 {
		t.Errorf("%d requests in flight at once, above the capacity", m)
	}
}

// Shrinking closes idle sessions at once, SDK-side, as with one acceptor; the split does not
// ask the nodes to retire those again.
func TestShrinkingManyNodesRetiresEachSessionOnce(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	ln := listenMany(t, Options{Capacity: 4}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	before := len(a.serviceLines()) + len(b.serviceLines())
	ln.SetCapacity(2)
	waitHolding(t, ln, []*fakeNode{a, b}, 1, 1)
	retired := 0
	for _, n := range []*fakeNode{a, b} {
		for _, line := range n.serviceLines() {
			var k int
			if _, err := fmt.Sscanf(line, "RETIRE %d", &k); err == nil {
				retired += k
			}
		}
	}
	// Two idle sessions closed by the shrink; at most one more moves if both were at one node.
	if retired > 1 {
		t.Errorf("%d sessions asked to retire after the shrink closed two (lines after it: %d)", retired, len(a.serviceLines())+len(b.serviceLines())-before)
	}
}

// An operator's drain of this instance at one node (410) holds it out there only: the
// sessions go to the other node, and once resumed the node's link probe brings it back.
func TestADrainHoldAtOneNodeMovesItsShareUntilResumed(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	var logs logLines
	ln := listenMany(t, Options{Capacity: 4, DrainedProbe: 10 * time.Millisecond, Logger: logs.logger()}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	b.mu.Lock()
	b.sessionTo, b.controlTo = refusal(410), refusal(410)
	b.closeLocked(2) // sluice ctl drain closes the instance's sessions there
	b.mu.Unlock()
	waitHolding(t, ln, []*fakeNode{a, b}, 4, 0)
	if st := statusOf(t, ln, b.addr); st.State != "drained" || st.Live {
		t.Errorf("b: %+v", st)
	}
	b.mu.Lock()
	b.sessionTo, b.controlTo = "", "" // sluice ctl resume
	b.mu.Unlock()
	a.send("DEMAND 0 0 0 4")
	// With no demand anywhere b gets its floor of one, and nothing else moves.
	waitUntil(t, ln, "b is live again", func(l *Listener) bool {
		st, _ := nodeOf(l, b.addr)
		return st.Live && st.Target == 1
	})
	waitHolding(t, ln, []*fakeNode{a, b}, 3, 1)
	if n := logs.count("level=WARN", "drained", b.addr); n != 1 {
		t.Errorf("%d warnings that b holds the instance drained, want 1:\n%s", n, &logs)
	}
	if n := logs.count("level=INFO", "resumed", b.addr); n != 1 {
		t.Errorf("%d lines that b resumed it, want 1:\n%s", n, &logs)
	}
}

// Shutdown drains at every node that holds sessions and returns once they are all closed.
func TestShutdownDrainsEveryNode(t *testing.T) {
	t.Parallel()
	a, b := newFakeNode(t, "127.0.0.1", 0), newFakeNode(t, "127.0.0.1", 0)
	ln := listenMany(t, Options{Capacity: 4, Instance: "api-1"}, a, b)
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a, b}, 2, 2)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, n := range []*fakeNode{a, b} {
		n.mu.Lock()
		left := len(n.sessions)
		n.mu.Unlock()
		if left != 0 {
			t.Errorf("%s still has %d sessions: not drained", n.addr, left)
		}
	}
}

// Each node's TLS server name is the dns: name or the list entry's host, unless Options.TLS
// names one; every node gets the same token.
func TestEachNodeDialsWithItsHostAsTheTLSServerName(t *testing.T) {
	t.Parallel()
	addr := netip.MustParseAddrPort("10.0.0.7:7070")
	o := Options{Service: "api", Token: "s3cret", TLS: &tls.Config{}}
	for host, want := range map[string]string{"nodes.test": "nodes.test", "[2001:db8::1]": "2001:db8::1", "10.0.0.7": "10.0.0.7"} {
		if got := newNodeDialer(&o, addr, host).tls.ServerName; got != want {
			t.Errorf("host %q: server name %q, want %q", host, got, want)
		}
	}
	o.TLS.ServerName = "sluice.internal"
	d := newNodeDialer(&o, addr, "nodes.test")
	if d.tls.ServerName != "sluice.internal" || d.address != "10.0.0.7:7070" || d.id.token != "s3cret" {
		t.Errorf("dialer %+v", d)
	}
}

// A link silent for 3 s (three missed heartbeats; here the test's shorter silence) is dialed
// again at once; the node stays live meanwhile and its sessions stay.
func TestASilentLinkIsDialedAgain(t *testing.T) {
	t.Parallel()
	a := newFakeNode(t, "127.0.0.1", 0) // it sends one DEMAND per link, then nothing
	// Listed twice: a list (so control links), and one node.
	ln := listenMany(t, Options{Capacity: 2, Acceptors: []string{a.addr, a.addr}, silence: 100 * time.Millisecond})
	serve(t, ln, hello)
	waitHolding(t, ln, []*fakeNode{a}, 2)
	a.waitFor("a second link", func(n *fakeNode) bool { return len(n.links) >= 2 })
	if st := statusOf(t, ln, a.addr); !st.Live || st.Held != 2 {
		t.Errorf("after the silence: %+v", st)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.registered != 2 {
		t.Errorf("%d registrations, want 2: the sessions stay", a.registered)
	}
}
