package sluice

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Every scenario of protocol/vectors/fleet.json (its _doc says how to replay one), against the
// Listener's bookkeeping of many nodes on a fake clock: each event is the call a control link
// (link.go) or a session slot (slot.go) makes for it, without sockets.

const fleetVectorsPath = "../../protocol/vectors/fleet.json"

type fleetVectors struct {
	Version   int             `json:"version"`
	Doc       string          `json:"_doc"`
	Scenarios []fleetScenario `json:"scenarios"`
}

type fleetScenario struct {
	Name    string `json:"name"`
	Options struct {
		Capacity         int     `json:"capacity"`
		NodeGrace        float64 `json:"node_grace"`
		HandshakeTimeout float64 `json:"handshake_timeout"`
		Backoff          *struct {
			Initial float64 `json:"initial"`
			Max     float64 `json:"max"`
		} `json:"backoff"`
	} `json:"options"`
	Steps []struct {
		At     float64             `json:"at"`
		Do     [][]json.RawMessage `json:"do"`
		Expect fleetSeen           `json:"expect"`
	} `json:"steps"`
}

// fleetSeen is what the SDK did in a step, in the shape of a step's expect: retire, dials and
// closes always (nil and empty alike), targets and live when the step names them.
type fleetSeen struct {
	Retire  map[string]int  `json:"retire"`
	Dials   map[string]int  `json:"dials"`
	Closes  map[string]int  `json:"closes"`
	Targets map[string]int  `json:"targets"`
	Live    map[string]bool `json:"live"`
}

func loadFleetVectors(t *testing.T) fleetVectors {
	t.Helper()
	raw, err := os.ReadFile(fleetVectorsPath)
	if err != nil {
		t.Fatalf("the shared fleet vectors must be present: %v", err)
	}
	// Strictly: an event or an expectation this replay does not know fails it, rather than
	// passing unchecked.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var v fleetVectors
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("parse %s: %v", fleetVectorsPath, err)
	}
	if v.Version != 1 || v.Doc == "" || len(v.Scenarios) == 0 {
		t.Fatalf("%s: version %d with %d scenarios, want version 1 and some", fleetVectorsPath, v.Version, len(v.Scenarios))
	}
	return v
}

func TestFleetVectors(t *testing.T) {
	t.Parallel()
	for _, sc := range loadFleetVectors(t).Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			r := newFleetReplay(t, sc)
			for i, step := range sc.Steps {
				got := r.step(step.At, step.Do, step.Expect)
				if want := normalized(step.Expect); !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (at %gs, %s):\n got %+v\nwant %+v\nlog:\n%s", i, step.At, events(step.Do), got, want, &r.logs)
				}
			}
		})
	}
}

// fakeClock stands still until advance moves it, running each timer that falls due on the
// way at its own time, in the order they fall due (then set).
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	f  func()
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timers = append(c.timers, fakeTimer{c.now.Add(d), f})
}

func (c *fakeClock) advance(to time.Time) {
	for {
		c.mu.Lock()
		next := -1
		for i, tm := range c.timers {
			if !tm.at.After(to) && (next < 0 || tm.at.Before(c.timers[next].at)) {
				next = i
			}
		}
		if next < 0 {
			c.now = maxTime(c.now, to)
			c.mu.Unlock()
			return
		}
		tm := c.timers[next]
		c.timers = append(c.timers[:next], c.timers[next+1:]...)
		c.now = maxTime(c.now, tm.at)
		c.mu.Unlock()
		tm.f() // unlocked: it may set timers
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fleetReplay is one scenario's SDK side: a Listener that dials nothing itself, the links
// the events open, and the sessions registered or being dialed at each node.
type fleetReplay struct {
	t        *testing.T
	l        *Listener
	clock    *fakeClock
	start    time.Time
	logs     logLines
	names    []string // in the order first resolved: a name's address is 192.0.2.<index+1>
	links    map[string]*link
	dialing  map[string]int
	sessions map[string][]*sessionConn // registered and open, oldest first
	seen     fleetSeen                 // this step's
}

func newFleetReplay(t *testing.T, sc fleetScenario) *fleetReplay {
	r := &fleetReplay{
		t: t, clock: &fakeClock{now: time.Unix(1_000_000, 0)},
		links: make(map[string]*link), dialing: make(map[string]int), sessions: make(map[string][]*sessionConn),
	}
	r.start = r.clock.now
	seconds := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	opts := Options{
		Acceptor: "dns:fleet.test:7070", Service: "api", Capacity: sc.Options.Capacity,
		NodeGrace: seconds(sc.Options.NodeGrace), HandshakeTimeout: seconds(sc.Options.HandshakeTimeout),
		Logger: r.logs.logger(), clock: r.clock, check: sumBelow(t),
		// No jitter: the scenarios name the instants a backing-off node is dialed again.
		Backoff: Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: -1},
	}.withDefaults()
	if b := sc.Options.Backoff; b != nil {
		opts.Backoff.Initial, opts.Backoff.Max = seconds(b.Initial), seconds(b.Max)
	}
	if err := opts.validate(); err != nil {
		t.Fatal(err)
	}
	r.l = newListener(t.Context(), opts)
	// No link or session is dialed: the events play their part (a link's loop returns at
	// once), and the capacity needs no slot goroutines, as the replay picks for them.
	r.l.cancelDials()
	r.l.mu.Lock()
	r.l.counts.resize(sc.Options.Capacity)
	r.l.mu.Unlock()
	t.Cleanup(func() {
		for _, k := range r.links {
			k.conn.Close()
		}
	})
	return r
}

// step runs one step of a scenario and returns what the SDK did in it.
func (r *fleetReplay) step(at float64, do [][]json.RawMessage, expect fleetSeen) fleetSeen {
	r.seen = fleetSeen{Retire: map[string]int{}, Dials: map[string]int{}, Closes: map[string]int{}}
	r.clock.advance(r.start.Add(time.Duration(at * float64(time.Second))))
	r.settle()
	for _, ev := range do {
		r.do(ev)
		r.drainLinks()
	}
	r.settle()
	r.drainLinks()
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if expect.Targets != nil {
		r.seen.Targets = map[string]int{}
		for name := range expect.Targets {
			r.seen.Targets[name] = r.node(name).target
		}
	}
	if expect.Live != nil {
		r.seen.Live = map[string]bool{}
		for name := range expect.Live {
			r.seen.Live[name] = r.node(name).live()
		}
	}
	return normalized(r.seen)
}

// settle ends the sessions the SDK closed itself (all idle in these scenarios, so at once),
// and lets the slots dial wherever the rules let them.
func (r *fleetReplay) settle() {
	for {
		r.l.mu.Lock()
		ended := false
		for name, open := range r.sessions {
			kept := open[:0]
			for _, c := range open {
				if c.evicted.Load() {
					r.l.closedLocked(c)
					r.seen.Closes[name]++
					ended = true
				} else {
					kept = append(kept, c)
				}
			}
			r.sessions[name] = kept
		}
		n, _ := r.l.pickLocked(r.clock.Now())
		r.l.mu.Unlock()
		if n != nil {
			r.seen.Dials[r.nameOf(n)]++
			r.dialing[r.nameOf(n)]++
		}
		if !ended && n == nil {
			return
		}
	}
}

// drainLinks reads what the SDK wrote on the links: the RETIRE lines are tallied.
func (r *fleetReplay) drainLinks() {
	for name, k := range r.links {
		for len(k.out) > 0 {
			line := strings.TrimSuffix(<-k.out, "\n")
			if n, ok := strings.CutPrefix(line, "RETIRE "); ok {
				k, err := strconv.Atoi(n)
				if err != nil {
					r.t.Fatalf("%s: the SDK wrote %q", name, line)
				}
				r.seen.Retire[name] += k
			}
		}
	}
}

// do plays one event: what a link or a slot would call for it.
func (r *fleetReplay) do(raw []json.RawMessage) {
	r.t.Helper()
	var kind string
	args := make([]any, len(raw)-1)
	if err := json.Unmarshal(raw[0], &kind); err != nil {
		r.t.Fatalf("event %s: %v", events([][]json.RawMessage{raw}), err)
	}
	for i, a := range raw[1:] {
		if err := json.Unmarshal(a, &args[i]); err != nil {
			r.t.Fatalf("event %s: %v", events([][]json.RawMessage{raw}), err)
		}
	}
	if kind == "resolve" {
		r.resolve(args[0].([]any))
		return
	}
	name := args[0].(string)
	r.l.mu.Lock()
	n, epoch := r.node(name), r.node(name).report.epoch
	r.l.mu.Unlock()
	switch kind {
	case "up":
		conn, _ := net.Pipe()
		k := &link{conn: conn, out: make(chan string, 64), done: make(chan struct{})}
		if old := r.links[name]; old != nil {
			old.conn.Close()
		}
		r.links[name] = k
		r.l.linkAnswered(n, k)
	case "line":
		line, err := parseNodeLine(args[1].(string))
		if err != nil {
			r.t.Fatalf("%s: %v", name, err)
		}
		r.l.heard(n, r.links[name], line)
	case "lost":
		r.l.linkLost(n, r.links[name], io.EOF, false)
	case "refused":
		refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		r.l.linkFailed(n, &Error{Op: "control", Kind: KindConnect, Err: refused}, epoch)
	case "timeout":
		r.l.linkFailed(n, &Error{Op: "control", Kind: KindTimeout, Err: fmt.Errorf("no answer within %s", r.l.opts.HandshakeTimeout)}, epoch)
	case "registered":
		r.registered(name, n, int(args[1].(float64)))
	case "closed":
		r.closed(name, int(args[1].(float64)))
	case "failed":
		r.failed(name, n, epoch, int(args[1].(float64)))
	default:
		r.t.Fatalf("an event this replay does not know: %s", events([][]json.RawMessage{raw}))
	}
}

func (r *fleetReplay) resolve(names []any) {
	var all []found
	for _, x := range names {
		name := x.(string)
		if r.index(name) < 0 {
			r.names = append(r.names, name)
		}
		all = append(all, found{addr: r.addr(name), host: "fleet.test"})
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	r.l.setNodesLocked(all)
}

// registered: k of the dials under way to name are answered 101, as a slot's.
func (r *fleetReplay) registered(name string, n *node, k int) {
	if r.dialing[name] < k {
		r.t.Fatalf("%d registered at %s, %d dialed", k, name, r.dialing[name])
	}
	for range k {
		r.dialing[name]--
		c := &sessionConn{l: r.l, node: n, done: make(chan struct{})}
		r.l.registeredOn(turn{epoch: n.report.epoch, node: n})
		r.l.mu.Lock()
		r.l.openedLocked(c)
		r.l.mu.Unlock()
		r.sessions[name] = append(r.sessions[name], c)
	}
}

// failed: k of the session dials under way to the node fail with a refusal that is retried.
func (r *fleetReplay) failed(name string, n *node, epoch int, k int) {
	if r.dialing[name] < k {
		r.t.Fatalf("%d failed at %s, %d dialed", k, name, r.dialing[name])
	}
	for range k {
		r.dialing[name]--
		refused := &Error{Op: "register", Kind: KindRefused, Status: 503}
		r.l.dialFailed(turn{epoch: epoch, node: n}, refused)
	}
}

// closed: the node closes k of this instance's sessions there, the oldest first.
func (r *fleetReplay) closed(name string, k int) {
	open := r.sessions[name]
	if len(open) < k {
		r.t.Fatalf("%d closed at %s, %d open", k, name, len(open))
	}
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	for _, c := range open[:k] {
		r.l.closedLocked(c)
	}
	r.sessions[name] = open[k:]
}

func (r *fleetReplay) index(name string) int {
	for i, n := range r.names {
		if n == name {
			return i
		}
	}
	return -1
}

func (r *fleetReplay) addr(name string) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(r.index(name) + 1)}), 7070)
}

// node is the Listener's node of that name; r.l.mu must be held.
func (r *fleetReplay) node(name string) *node {
	if r.index(name) >= 0 {
		if n := r.l.nodeAt(r.addr(name).String()); n != nil {
			return n
		}
	}
	r.t.Fatalf("no node %s", name)
	return nil
}

func (r *fleetReplay) nameOf(n *node) string {
	return r.names[n.addr.Addr().As4()[3]-1]
}

// normalized counts only what happened: a node with nothing is left out, and nil is empty.
func normalized(s fleetSeen) fleetSeen {
	nonzero := func(m map[string]int) map[string]int {
		out := map[string]int{}
		for k, v := range m {
			if v != 0 {
				out[k] = v
			}
		}
		return out
	}
	s.Retire, s.Dials, s.Closes = nonzero(s.Retire), nonzero(s.Dials), nonzero(s.Closes)
	return s
}

func events(do [][]json.RawMessage) string {
	var b strings.Builder
	for i, ev := range do {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("[")
		for j, a := range ev {
			if j > 0 {
				b.WriteString(" ")
			}
			b.Write(a)
		}
		b.WriteString("]")
	}
	return b.String()
}
