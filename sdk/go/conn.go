package sluice

import (
	"net"
	"sync"
	"sync/atomic"
)

// sessionConn is a registered session as Accept returns it: the connection to the acceptor,
// with the bytes read past the 101 head replayed first.
type sessionConn struct {
	net.Conn
	addr *sessionAddr
	l    *Listener

	mu   sync.Mutex
	rest []byte // read past the 101 head; served before the connection's own bytes

	// served: the proxy sent at least one byte (a request) on this session.
	served atomic.Bool
	// retired: the session answered a retirement with Connection: close; do not re-dial.
	retired atomic.Bool

	closeOnce sync.Once
	done      chan struct{} // closed by Close
}

func newSessionConn(l *Listener, conn net.Conn, rest []byte) *sessionConn {
	c := &sessionConn{Conn: conn, l: l, rest: rest, done: make(chan struct{})}
	c.addr = &sessionAddr{local: conn.LocalAddr(), conn: c}
	return c
}

// Read serves the replayed bytes first, then the connection's.
func (c *sessionConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		c.mu.Unlock()
		c.served.Store(true)
		return n, nil
	}
	c.mu.Unlock()
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.served.Store(true)
	}
	return n, err
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
