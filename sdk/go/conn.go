package sluice

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// sessionConn is a registered session as Accept returns it: the connection to the acceptor,
// with the bytes read past the 101 head replayed first.
type sessionConn struct {
	net.Conn
	addr *sessionAddr
	l    *Listener

	mu   sync.Mutex
	rest []byte // read past the 101 head; served before the connection's own bytes

	// served: the proxy sent at least one byte (a request) on this session; on an HTTP/2
	// session, the first request's HEADERS frame (h2 follows the frames until then).
	served atomic.Bool
	h2     *h2Scan
	// retired: the session answered a retirement with Connection: close, or was closed
	// idle for one; do not re-dial.
	retired atomic.Bool
	// node is the node of many it is registered at (nil with one acceptor).
	node *node
	// evicted: the SDK closes it because its node is not live (or holds too many without a
	// link to retire them): idle at once, busy with Connection: close after the response. Its
	// slot then dials elsewhere at once.
	evicted atomic.Bool
	// handlers counts requests of this session inside ln.Handler right now.
	handlers atomic.Int32
	// upgrading: a request asked for an upgrade, so the handler may have hijacked the
	// connection; it is never closed as idle.
	upgrading atomic.Bool
	// closingIdle: retired while idle; net/http's next read for a request meets EOF, so the
	// server closes the session without a response in flight.
	closingIdle atomic.Bool

	closeOnce sync.Once
	done      chan struct{} // closed by Close
}

func newSessionConn(l *Listener, conn net.Conn, rest []byte) *sessionConn {
	c := &sessionConn{Conn: conn, l: l, rest: rest, done: make(chan struct{})}
	if l != nil && l.opts.Streams > 0 {
		c.h2 = &h2Scan{}
	}
	c.addr = &sessionAddr{local: conn.LocalAddr(), conn: c}
	return c
}

// Read serves the replayed bytes first, then the connection's. A session closed idle reads
// EOF where net/http waits for the next request.
func (c *sessionConn) Read(p []byte) (int, error) {
	if c.idleClosed() {
		return 0, io.EOF
	}
	c.mu.Lock()
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		c.sawLocked(p[:n])
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	if n > 0 && !c.served.Load() {
		c.mu.Lock()
		c.sawLocked(p[:n])
		c.mu.Unlock()
	}
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && c.idleClosed() {
		return 0, io.EOF // the read closeIdle unblocked
	}
	return n, err
}

// sawLocked marks the session served by bytes read from it: any byte on an HTTP/1.1 session
// (a request), a HEADERS frame on an HTTP/2 one. c.mu must be held.
func (c *sessionConn) sawLocked(p []byte) {
	if c.served.Load() {
		return
	}
	if c.h2 == nil || c.h2.request(p) {
		c.served.Store(true)
		c.h2 = nil
	}
}

// idleClosed: retired while idle and no handler is running on it.
func (c *sessionConn) idleClosed() bool {
	return c.closingIdle.Load() && c.handlers.Load() == 0
}

// closableIdle: no handler runs on it and no handler may have taken it over.
func (c *sessionConn) closableIdle() bool {
	return c.handlers.Load() == 0 && !c.upgrading.Load() && !c.retired.Load()
}

// closeIdle retires an idle session: a read net/http is blocked in returns at once (and EOF).
func (c *sessionConn) closeIdle() {
	c.closingIdle.Store(true)
	c.Conn.SetReadDeadline(time.Unix(1, 0))
}

// SetReadDeadline keeps the past deadline of a session closed idle, which net/http would
// otherwise clear before reading the next request.
func (c *sessionConn) SetReadDeadline(t time.Time) error {
	if c.closingIdle.Load() {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

// Close closes the session; its slot then re-dials a replacement unless stopping or retired.
func (c *sessionConn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		close(c.done)
	})
	return err
}

// LocalAddr is distinct per session and leads back to it, so that a handler can find the
// session from http.LocalAddrContextKey.
func (c *sessionConn) LocalAddr() net.Addr { return c.addr }

// sessionAddr is a session's local address; its identity (the pointer) names the session.
type sessionAddr struct {
	local net.Addr
	conn  *sessionConn
}

func (a *sessionAddr) Network() string {
	if a.local == nil {
		return "sluice"
	}
	return a.local.Network()
}

func (a *sessionAddr) String() string {
	if a.local == nil {
		return "sluice-session"
	}
	return a.local.String()
}
