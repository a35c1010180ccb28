package sluice

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const controlSwitched = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: sluice-control/1\r\n\r\n"

// fakeNode is one Sluice node of many as a service sees it: it registers sessions (kept for
// the test to drive as the proxy does), answers control links, sends the DEMAND and DRAINING
// lines the test asks for, records the service's lines and, unless told otherwise, closes
// sessions on RETIRE as a node closes idle ones.
type fakeNode struct {
	t    *testing.T
	ln   net.Listener
	addr string

	mu          sync.Mutex
	sessions    []*fakeSession // registered, in order, until the node closes them
	registered  int
	links       []net.Conn // every control link answered, the last one current
	lines       []string   // the service's lines, in order, across links
	manual      bool       // RETIRE is recorded, not acted on
	controlTo   string     // the answer to a control request; "" means 101
	sessionTo   string     // the answer to a registration; "" means 101
	conns       []net.Conn
	changed     chan struct{}
	firstDemand string // sent on a new link; "" means "DEMAND 0 0 0 <sessions>"
	// floor is sent before it on a link that said Sluice-Split: service, as a node that
	// knows FLOOR does ("FLOOR 0", "FLOOR 1"); "" sends none, as an older node.
	floor string
	// stall leaves control requests unanswered (a hung node, or one whose new process is
	// still starting behind the listening socket it was passed); they wait in stalled.
	stall   bool
	stalled []stalledLink
}

// stalledLink is a control request the node has read but not answered.
type stalledLink struct {
	conn net.Conn
	br   *bufio.Reader
	head []byte
}

// newFakeNode listens on ip (port 0 unless given) until the test ends.
func newFakeNode(t *testing.T, ip string, port int) *fakeNode {
	t.Helper()
	ln, err := net.Listen("tcp", fmt.Sprintf("%s:%d", ip, port))
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{t: t, ln: ln, addr: ln.Addr().String(), changed: make(chan struct{})}
	t.Cleanup(n.kill)
	go n.accept()
	return n
}

func (n *fakeNode) accept() {
	for {
		conn, err := n.ln.Accept()
		if err != nil {
			return
		}
		n.mu.Lock()
		n.conns = append(n.conns, conn)
		n.mu.Unlock()
		go n.handshake(conn)
	}
}

func (n *fakeNode) handshake(conn net.Conn) {
	br := bufio.NewReader(conn)
	head, err := readHead(br)
	if err != nil {
		conn.Close()
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	defer n.notifyLocked()
	if bytes.HasPrefix(head, []byte("GET /.sluice/v1/control ")) {
		n.controlLocked(conn, br, head)
		return
	}
	if bytes.HasPrefix(head, []byte("POST /.sluice/v1/drain ")) {
		for _, s := range n.sessions {
			s.conn.Close()
		}
		n.sessions = nil
		conn.Write([]byte(drained))
		conn.Close()
		return
	}
	answer := cmpOr(n.sessionTo, switched)
	conn.Write([]byte(answer))
	if answer != switched {
		conn.Close()
		return
	}
	n.registered++
	n.sessions = append(n.sessions, &fakeSession{conn: conn, br: br, hello: head})
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// controlLocked answers a control link and reads the service's lines on it.
func (n *fakeNode) controlLocked(conn net.Conn, br *bufio.Reader, head []byte) {
	if n.stall {
		n.stalled = append(n.stalled, stalledLink{conn, br, head})
		return
	}
	answer := cmpOr(n.controlTo, controlSwitched)
	if answer != controlSwitched {
		conn.Write([]byte(answer))
		conn.Close()
		return
	}
	first := cmpOr(n.firstDemand, fmt.Sprintf("DEMAND 0 0 0 %d", len(n.sessions))) + "\n"
	if n.floor != "" && bytes.Contains(head, []byte("\r\nSluice-Split: service\r\n")) {
		first = n.floor + "\n" + first
	}
	conn.Write([]byte(answer + first))
	n.links = append(n.links, conn)
	go n.readLines(conn, br)
}

func (n *fakeNode) readLines(conn net.Conn, br *bufio.Reader) {
	for {
		text, err := readControlLine(br)
		if err != nil {
			conn.Close()
			n.mu.Lock()
			n.notifyLocked()
			n.mu.Unlock()
			return
		}
		kind, k, err := parseServiceLine(text)
		if err != nil {
			n.t.Errorf("the service sent an invalid line %q", text)
		}
		n.mu.Lock()
		n.lines = append(n.lines, text)
		if kind == "RETIRE" && !n.manual {
			n.closeLocked(k)
		}
		n.notifyLocked()
		n.mu.Unlock()
	}
}

// closeLocked closes k of the instance's sessions, the newest first, as a node retires idle
// ones.
func (n *fakeNode) closeLocked(k int) {
	for ; k > 0 && len(n.sessions) > 0; k-- {
		last := n.sessions[len(n.sessions)-1]
		n.sessions = n.sessions[:len(n.sessions)-1]
		last.conn.Close()
	}
}

// closeSessions closes k of the instance's sessions, as a stopping node closes those that
// no queued request needs.
func (n *fakeNode) closeSessions(k int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closeLocked(k)
	n.notifyLocked()
}

func (n *fakeNode) notifyLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

// send writes a line (without its \n) on the current control link.
func (n *fakeNode) send(line string) {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.links) == 0 {
		n.t.Fatal("no control link to send on")
	}
	n.links[len(n.links)-1].Write([]byte(line + "\n"))
}

// waitFor waits, without polling, until cond holds on the node's state under its lock.
func (n *fakeNode) waitFor(what string, cond func(n *fakeNode) bool) {
	n.t.Helper()
	deadline := time.After(testDeadline)
	for {
		n.mu.Lock()
		ok, changed := cond(n), n.changed
		n.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			n.t.Fatalf("%s: timed out waiting until %s (lines %q)", n.addr, what, n.serviceLines())
		}
	}
}

func (n *fakeNode) serviceLines() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.lines)
}

func (n *fakeNode) open() []*fakeSession {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.sessions)
}

// unstall answers the control requests left waiting, and those to come, as a restarted
// process that has come up does.
func (n *fakeNode) unstall() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stall = false
	for _, s := range n.stalled {
		n.controlLocked(s.conn, s.br, s.head)
	}
	n.stalled = nil
	n.notifyLocked()
}

// closeLinks closes the node's control links, as a node's process does when it ends; its
// sessions stay open.
func (n *fakeNode) closeLinks() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.links {
		c.Close()
	}
	n.notifyLocked()
}

// kill ends the node at once: listener, sessions and links close, as when it crashes.
func (n *fakeNode) kill() {
	n.ln.Close()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range n.conns {
		c.Close()
	}
	n.sessions = nil
	n.notifyLocked()
}

// statusOf is the status of the node at addr, read as an application reads it.
func statusOf(t *testing.T, l *Listener, addr string) NodeStatus {
	t.Helper()
	for _, n := range l.Status().Nodes {
		if n.Address == addr {
			return n
		}
	}
	t.Fatalf("no node %s", addr)
	return NodeStatus{}
}

// nodeOf is the status of the node at addr, for conditions that hold the Listener's lock.
func nodeOf(l *Listener, addr string) (NodeStatus, bool) {
	for _, n := range l.nodes {
		if n.addr.String() == addr {
			return n.status(), true
		}
	}
	return NodeStatus{}, false
}

// held is what the instance holds at addr (registered or being dialed, less retiring).
func held(l *Listener, addr string) int {
	st, _ := nodeOf(l, addr)
	return st.Held
}

// sumBelow fails the test whenever the sessions held everywhere (registered, being dialed,
// asked to retire but not closed) exceed the capacity plus the retirements a shrink owes.
func sumBelow(t *testing.T) func(*Listener) {
	return func(l *Listener) {
		total, retired := 0, 0
		for _, n := range l.nodes {
			total += n.sessions
			for c := range n.members {
				if c.retired.Load() {
					retired++
				}
			}
		}
		if limit := l.counts.target + l.counts.retire; total-retired > limit {
			t.Errorf("%d sessions held across the nodes (%d retired by a shrink), above %d", total, retired, limit)
		}
	}
}

// listenMany starts an instance on the nodes' list address with the sum check on.
func listenMany(t *testing.T, o Options, nodes ...*fakeNode) *Listener {
	t.Helper()
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	if o.Acceptor == "" && o.Acceptors == nil {
		o.Acceptors = addrs
	}
	if o.Service == "" {
		o.Service = "api"
	}
	if o.Backoff == (Backoff{}) {
		o.Backoff = fastBackoff
	}
	o.check = sumBelow(t)
	ln, err := Listen(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// waitHolding waits until the instance holds want[i] registered sessions at nodes[i], with no
// dial or retirement under way there.
func waitHolding(t *testing.T, ln *Listener, nodes []*fakeNode, want ...int) {
	t.Helper()
	waitUntil(t, ln, fmt.Sprintf("held %v", want), func(l *Listener) bool {
		for i, f := range nodes {
			n := l.nodeAt(f.addr)
			if n == nil || len(n.members) != want[i] || n.sessions != want[i] || n.retiring+n.evicting != 0 {
				return false
			}
		}
		return true
	})
}

func (l *Listener) nodeAt(addr string) *node {
	for _, n := range l.nodes {
		if n.addr.String() == addr {
			return n
		}
	}
	return nil
}

// fakeResolver answers a name with the addresses the test sets.
type fakeResolver struct {
	mu    sync.Mutex
	addrs []netip.Addr
	err   error
}

func (r *fakeResolver) set(addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs = nil
	for _, a := range addrs {
		r.addrs = append(r.addrs, netip.MustParseAddr(a))
	}
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	if !strings.HasSuffix(host, ".test") {
		return nil, fmt.Errorf("no such host %q", host)
	}
	return slices.Clone(r.addrs), nil
}
