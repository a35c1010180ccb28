package sluice

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
)

// Listener keeps sessions registered with the acceptor and yields each as a connection from
// Accept. It implements [net.Listener], so http.Server.Serve(ln) serves through Sluice.
// Its methods are safe for concurrent use.
type Listener struct {
	opts   Options
	dialer *dialer
	log    *slog.Logger

	// dialCtx is the parent of every dial; Close cancels it.
	dialCtx     context.Context
	cancelDials context.CancelFunc
	stopParent  func() bool

	accept      chan *sessionConn
	closed      chan struct{} // Accept fails from here on
	closeAccept func()

	mu         sync.Mutex
	counts     counts
	running    int // slot goroutines alive
	registered int
	lastErr    error
	live       map[*sessionConn]struct{}
	changed    chan struct{} // closed and replaced at every change of the fields above
	nextSlot   int
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
}

// Listen validates opts and starts keeping opts.Capacity sessions registered in the
// background; it returns at once, before any session is registered (see [Listener.Watch]).
// It fails only for invalid options, with an error wrapping [ErrInvalidOptions].
//
// ctx bounds the Listener's life: when it ends, the Listener closes as by Close, abruptly.
// To leave gracefully on a signal, pass a context that outlives the signal (such as
// context.Background()) and call Shutdown.
func Listen(ctx context.Context, opts Options) (*Listener, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	l := &Listener{
		opts:    opts,
		dialer:  newDialer(&opts),
		log:     opts.Logger.With("service", opts.Service, "acceptor", opts.Acceptor),
		accept:  make(chan *sessionConn),
		closed:  make(chan struct{}),
		live:    make(map[*sessionConn]struct{}),
		changed: make(chan struct{}),
	}
	l.dialCtx, l.cancelDials = context.WithCancel(context.WithoutCancel(ctx))
	l.closeAccept = sync.OnceFunc(func() { close(l.closed) })
	l.stopParent = context.AfterFunc(ctx, func() { l.Close() })
	l.SetCapacity(opts.Capacity)
	return l, nil
}

// Accept waits for the next registered session. After Close or Shutdown it returns an error
// wrapping [net.ErrClosed].
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, l.errClosed()
	default:
	}
	select {
	case c := <-l.accept:
		return c, nil
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
// backing off) ends; a registered session ends after its next response if the handler is
// wrapped with [Listener.Handler], and otherwise only when the proxy closes it. Setting the
// current capacity again restarts slots refused for good. Ignored after Close or Shutdown;
// a negative n counts as 0.
func (l *Listener) SetCapacity(n int) {
	n = max(n, 0)
	l.mu.Lock()
	if l.counts.stopping {
		l.mu.Unlock()
		return
	}
	spawn := l.counts.resize(n)
	first := l.nextSlot
	l.nextSlot += spawn
	l.running += spawn
	l.notifyLocked()
	l.mu.Unlock()
	l.log.Info("capacity set", "capacity", n, "spawn", spawn)
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
	return Status{Registered: l.registered, Capacity: l.counts.target, LastError: l.lastErr}, l.changed
}

// Close stops re-dialing and closes every session at once, without draining: requests in
// flight on them fail. Accept then returns an error wrapping net.ErrClosed. Use Shutdown to
// leave gracefully. Close always returns nil.
func (l *Listener) Close() error {
	l.stop()
	l.stopParent()
	l.cancelDials()
	l.closeAccept()
	l.mu.Lock()
	live := make([]*sessionConn, 0, len(l.live))
	for c := range l.live {
		live = append(live, c)
	}
	l.mu.Unlock()
	for _, c := range live {
		c.Close()
	}
	return nil
}

// Shutdown leaves gracefully (DESIGN.md §3 "Drain"): it stops re-dialing, sends
// `POST /.sluice/v1/drain` for this instance on a new connection and, once the proxy answers
// 200, waits until the proxy has closed every session: the proxy finishes busy sessions
// first, so no request is lost. It returns when all sessions are closed, or with ctx's error
// when ctx ends first, or at once with the drain's error. Accept then returns an error
// wrapping net.ErrClosed; sessions still open are left to the http.Server, so call
// srv.Shutdown next:
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
	l.log.Info("draining")
	if err := l.dialer.drain(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	if err := l.waitSlots(ctx); err != nil {
		return err
	}
	l.log.Info("drained")
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
			return ctx.Err()
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

// notifyLocked wakes everyone waiting on a change; l.mu must be held.
func (l *Listener) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *Listener) String() string {
	return fmt.Sprintf("sluice.Listener(%s at %s)", l.opts.Service, l.opts.Acceptor)
}
