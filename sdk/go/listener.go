package sluice

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Listener keeps sessions registered with the acceptor and yields each as a connection from
// Accept. It implements [net.Listener], so http.Server.Serve(ln) serves through Sluice.
// Its methods are safe for concurrent use.
type Listener struct {
	opts    Options
	address acceptorAddress
	// dialer dials the one acceptor; nil with many nodes, where each node has its own.
	dialer *dialer
	log    *slog.Logger

	// dialCtx is the parent of every dial; Close cancels it.
	dialCtx     context.Context
	cancelDials context.CancelFunc
	stopParent  func() bool

	accept chan *sessionConn
	closed chan struct{} // Accept fails from here on; closed by closeAccept

	// wrapped: Handler was called, so sessions report when a request is in a handler.
	wrapped atomic.Bool

	// drainMu serializes drain requests; drained: the proxy answered one with 200.
	drainMu sync.Mutex
	drained bool

	mu           sync.Mutex
	counts       counts
	acceptClosed bool // closed is closed: no session is handed to Accept any more
	aborted      bool // abort ran: every session is closed and nothing is drained any more
	running      int  // slot goroutines alive
	registered   int
	lastErr      error
	report       report
	// held is the 410 of an operator's drain while it holds the instance out: the slots wait,
	// and one of them probes at nextProbe (probing while its dial is out).
	held      error
	nextProbe time.Time
	probing   bool
	live      map[*sessionConn]struct{}
	// nodes are the nodes of many, in the order the split lists them (nil with one acceptor).
	nodes     []*node
	rebalance rebalanceLog
	// movesHeldUntil: no move by demand alone (the split's step 5) before then.
	movesHeldUntil time.Time
	changed        chan struct{} // closed and replaced at every change of the fields above
	nextSlot       int
	// resolveSoon: a node was lost (its link ended, or it went down), so the resolver looks
	// at the name again soon (resolve.go). Buffered: a send never blocks.
	resolveSoon chan struct{}
}

// Status is what an application can observe about its sessions.
type Status struct {
	// Registered counts sessions registered right now (handshake done, not yet closed).
	Registered int
	// Capacity is the capacity asked for; the sessions converge on it.
	Capacity int
	// LastError is the most recent dial, handshake or refusal error of any slot, such as a
	// 401 that stopped a slot for good; nil until one happens, not cleared by later successes.
	LastError error
	// Drained is true while an operator holds this instance drained (410, `sluice ctl
	// drain`): the slots wait and one registration probes every Options.DrainedProbe. With
	// many nodes the hold is per node (see Nodes).
	Drained bool
	// Nodes lists every node of many (nil with one acceptor), in the split's order.
	Nodes []NodeStatus
}

// Listen validates opts and starts keeping opts.Capacity sessions registered in the
// background; it returns at once, before any session is registered (see [Listener.Watch]).
// It fails only for invalid options, with an error wrapping [ErrInvalidOptions].
//
// ctx bounds the Listener's life: when it ends, the Listener stops re-dialing and closes every
// session at once, without draining (requests in flight on them fail). To leave gracefully on
// a signal, pass a context that outlives the signal (such as context.Background()) and call
// Shutdown, or Close (which http.Server.Shutdown calls).
func Listen(ctx context.Context, opts Options) (*Listener, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	l := newListener(ctx, opts)
	l.stopParent = context.AfterFunc(ctx, l.abort)
	if l.address.many() {
		go l.runResolver()
	} else {
		l.dialer = newDialer(&opts)
	}
	l.SetCapacity(opts.Capacity)
	return l, nil
}

// newListener is the Listener of valid opts before anything starts: no resolution, no slot,
// no dial.
func newListener(ctx context.Context, opts Options) *Listener {
	address, _ := opts.address() // validated
	l := &Listener{
		opts:    opts,
		address: address,
		log:     opts.Logger.With("service", opts.Service, "acceptor", opts.Acceptor),
		accept:  make(chan *sessionConn),
		closed:  make(chan struct{}),
		live:    make(map[*sessionConn]struct{}),
		changed: make(chan struct{}),

		resolveSoon: make(chan struct{}, 1),
	}
	l.report.log = l.log
	l.dialCtx, l.cancelDials = context.WithCancel(context.WithoutCancel(ctx))
	return l
}

// Accept waits for the next registered session. Once Close has begun or Shutdown has
// returned, it returns an error wrapping [net.ErrClosed].
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, l.errClosed()
	default:
	}
	select {
	case c := <-l.accept:
		select {
		case <-l.closed: // both were ready: Close wins, and the session goes with it
			c.Close()
			return nil, l.errClosed()
		default:
			return c, nil
		}
	case <-l.closed:
		return nil, l.errClosed()
	}
}

func (l *Listener) errClosed() error {
	return &net.OpError{Op: "accept", Net: "sluice", Addr: l.Addr(), Err: net.ErrClosed}
}

// Addr is the acceptor this Listener dials, with network "sluice".
func (l *Listener) Addr() net.Addr { return acceptorAddr(l.opts.Acceptor) }

type acceptorAddr string

func (a acceptorAddr) Network() string { return "sluice" }
func (a acceptorAddr) String() string  { return string(a) }

// SetCapacity changes how many sessions to keep registered. Growing dials new sessions at
// once. Shrinking owes retirements: a slot that is not registered at the moment (dialing or
// backing off) ends; with the handler wrapped by [Listener.Handler], idle sessions close at
// once (the proxy drops a session it sees closed while idle) and busy ones end after their
// response, so once SetCapacity returns no more than n requests reach the handler beyond
// those already running. Without the wrapper a registered session ends only when the proxy
// closes it. Setting the
// current capacity again restarts slots refused for good, and dials at once while an operator
// holds the instance drained (410). Ignored after Close or Shutdown; a negative n counts as 0.
func (l *Listener) SetCapacity(n int) {
	n = max(n, 0)
	l.mu.Lock()
	if l.counts.stopping {
		l.mu.Unlock()
		return
	}
	l.report.capacity(l.counts.target, n, l.held != nil)
	l.held = nil
	spawn := l.counts.resize(n)
	l.retireIdleLocked()
	l.capacityChangedLocked()
	first := l.nextSlot
	l.nextSlot += spawn
	l.running += spawn
	l.notifyLocked()
	l.mu.Unlock()
	for i := range spawn {
		go l.runSlot(first + i)
	}
}

// Status returns the sessions registered now, the capacity asked for and the last error.
func (l *Listener) Status() Status {
	st, _ := l.Watch()
	return st
}

// Watch returns the current Status and a channel that is closed at its next change, for
// readiness probes and tests that wait without polling.
func (l *Listener) Watch() (Status, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Status{Registered: l.registered, Capacity: l.counts.target, LastError: l.lastErr, Drained: l.held != nil}
	for _, n := range l.nodes {
		st.Nodes = append(st.Nodes, n.status())
	}
	return st, l.changed
}

// Close leaves gracefully within Options.DrainTimeout; http.Server.Shutdown and Serve call
// it, so srv.Shutdown(ctx) on its own loses no request. Accept fails at once with an error
// wrapping net.ErrClosed and a registered session not yet accepted is closed; then Close
// drains as Shutdown does (sending the drain only if no earlier one succeeded) and waits
// until the proxy has closed every session. If the drain fails or DrainTimeout passes first,
// Close closes the remaining sessions at once, in flight or not, and returns why.
func (l *Listener) Close() error {
	l.closeAccept()
	if l.isAborted() {
		return nil // srv.Serve closing the Listener after the Listen context ended
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.DrainTimeout)
	defer cancel()
	if err := l.Shutdown(ctx); err != nil {
		l.abort()
		return fmt.Errorf("sluice: closed the remaining sessions at once: %w", err)
	}
	return nil
}

// abort stops re-dialing and closes every session at once, without draining; the Listen
// context's end calls it.
func (l *Listener) abort() {
	l.stopParent()
	l.cancelDials()
	l.closeAccept()
	l.mu.Lock()
	l.aborted = true
	live := make([]*sessionConn, 0, len(l.live))
	for c := range l.live {
		live = append(live, c)
	}
	l.mu.Unlock()
	for _, c := range live {
		c.Close()
	}
}

// Shutdown leaves gracefully (docs/design.md §3 "Drain"): it stops re-dialing, sends
// `POST /.sluice/v1/drain` for this instance on a new connection (unless an earlier drain
// succeeded) and, once the proxy answers 200, waits until the proxy has closed every session:
// the proxy finishes busy sessions first, so no request is lost. Accept keeps yielding
// sessions meanwhile. It returns nil when all sessions are closed, an error wrapping ctx's
// error when ctx ends first, or at once the drain's [*Error]. Accept then returns an error
// wrapping net.ErrClosed; srv.Serve returns and closes the Listener, which gives sessions
// still open up to Options.DrainTimeout more (see Close). Call srv.Shutdown next:
//
//	ln.Shutdown(ctx) // the proxy stops sending requests and closes the sessions
//	srv.Shutdown(ctx) // then the server stops
//
// Without Instance set, the drain names no instance and the proxy drains the instance it
// identifies by this host's IP address.
func (l *Listener) Shutdown(ctx context.Context) error {
	l.stop()
	defer l.stopParent()
	defer l.closeAccept()
	defer l.cancelDials()
	if err := l.drain(ctx); err != nil {
		return err
	}
	if err := l.waitSlots(ctx); err != nil {
		return err
	}
	l.log.Info("drained")
	return nil
}

func (l *Listener) isAborted() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.aborted
}

// drain sends the drain request unless one already succeeded.
func (l *Listener) drain(ctx context.Context) error {
	l.drainMu.Lock()
	defer l.drainMu.Unlock()
	if l.drained {
		return nil
	}
	l.log.Info("draining")
	if l.dialer == nil {
		l.drainNodes(ctx)
		l.drained = true
		return nil
	}
	if err := l.dialer.drain(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("sluice: drain: no answer before the deadline: %w", ctx.Err())
		}
		return err
	}
	l.drained = true
	return nil
}

// waitSlots waits until every slot has ended, which after stop means that every session the
// slots registered is closed.
func (l *Listener) waitSlots(ctx context.Context) error {
	for {
		l.mu.Lock()
		running, changed := l.running, l.changed
		l.mu.Unlock()
		if running == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("sluice: the proxy had not closed every session when the wait ended (%d slots left): %w", running, ctx.Err())
		}
	}
}

func (l *Listener) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.counts.stopping {
		l.counts.stopping = true
		l.notifyLocked()
	}
}

// closeAccept makes Accept fail from now on and stops re-dialing; slots close the sessions
// they have not handed over yet.
func (l *Listener) closeAccept() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.acceptClosed {
		l.acceptClosed = true
		l.counts.stopping = true
		close(l.closed)
		l.notifyLocked()
	}
}

// notifyLocked wakes everyone waiting on a change; l.mu must be held.
func (l *Listener) notifyLocked() {
	if l.opts.check != nil {
		l.opts.check(l)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// String names the service and the acceptor, for logs.
func (l *Listener) String() string {
	return fmt.Sprintf("sluice.Listener(%s at %s)", l.opts.Service, l.opts.Acceptor)
}
