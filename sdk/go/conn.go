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
	// session, the first request's HEADERS frame.
	served atomic.Bool
	// h2 follows an HTTP/2 session's streams (Options.Streams; nil for HTTP/1.1), under mu;
	// idleClose: close the session as soon as no stream is open (a retirement it claimed
	// while busy).
	h2        *h2Streams
	idleClose bool
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
		c.h2 = newH2Streams()
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
	if n > 0 && (c.h2 != nil || !c.served.Load()) {
		c.mu.Lock()
		c.sawLocked(p[:n])
		c.mu.Unlock()
	}
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && c.idleClosed() {
		return 0, io.EOF // the read closeIdle unblocked
	}
	return n, err
}

// sawLocked follows bytes read from the session: any byte of an HTTP/1.1 session is a
// request; an HTTP/2 session's frames open streams. c.mu must be held.
func (c *sessionConn) sawLocked(p []byte) {
	if c.h2 == nil {
		c.served.Store(true)
		return
	}
	c.h2.read(p)
	if c.h2.requested {
		c.served.Store(true)
	}
}

// Write follows an HTTP/2 session's frames: a stream the server ends is closed, and a session
// waiting to close once idle closes after the write that ended its last stream.
func (c *sessionConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.h2 == nil || n == 0 {
		return n, err
	}
	c.mu.Lock()
	c.h2.wrote(p[:n])
	idle := c.idleClose && len(c.h2.open) == 0 && c.handlers.Load() == 0
	c.mu.Unlock()
	if idle {
		c.closeIdle()
	}
	return n, err
}

// streamsOpen: an HTTP/2 session has a stream open (always false for HTTP/1.1).
func (c *sessionConn) streamsOpen() bool {
	if c.h2 == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.h2.open) > 0
}

// closeWhenIdle closes an HTTP/2 session once no stream is open and no handler runs: now, or
// after the write that ends its last stream (see Write).
func (c *sessionConn) closeWhenIdle() {
	c.mu.Lock()
	c.idleClose = true
	idle := len(c.h2.open) == 0 && c.handlers.Load() == 0
	c.mu.Unlock()
	if idle {
		c.closeIdle()
	}
}

// idleClosed: retired while idle and no handler is running on it.
func (c *sessionConn) idleClosed() bool {
	return c.closingIdle.Load() && c.handlers.Load() == 0
}

// closableIdle: no handler runs on it, no handler may have taken it over, and (HTTP/2) no
// stream is open.
func (c *sessionConn) closableIdle() bool {
	return c.handlers.Load() == 0 && !c.upgrading.Load() && !c.retired.Load() && !c.streamsOpen()
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
// An HTTP/2 session closed idle closes gently: the server may have written its last frames
// just before while Sluice's (a WINDOW_UPDATE, a PING) sit unread, and closing a socket with
// unread bytes resets it, which can destroy what was written. So it sends its FIN first and
// reads until Sluice closes too (at most lingerClose) before closing.
func (c *sessionConn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		cw, ok := c.Conn.(interface{ CloseWrite() error })
		if c.h2 != nil && c.closingIdle.Load() && ok && cw.CloseWrite() == nil {
			err = nil
			go func() {
				c.Conn.SetReadDeadline(time.Now().Add(lingerClose))
				io.Copy(io.Discard, c.Conn)
				c.Conn.Close()
			}()
		} else {
			err = c.Conn.Close()
		}
		close(c.done)
	})
	return err
}

// lingerClose bounds the wait for Sluice to close an HTTP/2 session closed idle.
const lingerClose = 2 * time.Second

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
