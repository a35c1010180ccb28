package sluice

import "net/http"

// Handler wraps h for serving on this Listener's sessions. It sets r.RemoteAddr to the
// client's address as the proxy saw it (the Sluice-Client-Addr header the proxy sets on every
// request and never passes through from a client); without the wrapper, or for a request
// without a valid header, r.RemoteAddr is the session's peer, the acceptor. When SetCapacity has shrunk the
// capacity and a retirement is owed, the wrapper answers the current request with
// `Connection: close` — net/http then closes the session after the response, the proxy does
// not reuse it (docs/design.md §3 "Retire"), and its slot ends instead of re-dialing. This is
// race-free: no request is lost to the shrink.
//
// With Handler, shrinking also closes idle surplus sessions at once (see SetCapacity). Without
// it, shrinking takes effect only as sessions end for other reasons (the proxy closes them) or
// at slots that are not registered at the moment.
//
// Requests that did not arrive on a session of this Listener pass through unchanged.
func (l *Listener) Handler(h http.Handler) http.Handler {
	l.wrapped.Store(true)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := l.sessionOf(r)
		if c != nil {
			c.handlers.Add(1)
			if r.Header.Get("Upgrade") != "" {
				c.upgrading.Store(true)
			}
			defer l.handled(c)
			// Only a session's requests come from the proxy; anyone else could set the header.
			if addr, ok := parseClientAddr(r.Header.Values(clientAddrHeader)); ok {
				r.RemoteAddr = addr.String()
			}
		}
		if c != nil && (c.evicted.Load() || l.retires(c)) {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// sessionOf finds the session a request arrived on from its local address.
func (l *Listener) sessionOf(r *http.Request) *sessionConn {
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(*sessionAddr)
	if !ok || addr.conn.l != l {
		return nil
	}
	return addr.conn
}

// retires reports whether this request's response must retire its session, claiming an owed
// retirement for it if there is one.
func (l *Listener) retires(c *sessionConn) bool {
	if c.retired.Load() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.counts.claimRetirement() {
		return false
	}
	l.retiredLocked(c)
	l.notifyLocked()
	l.log.Debug("retiring session: answering with Connection: close")
	return true
}

// handled: a request of c left the handler. If a retirement is still owed (the capacity
// shrank while it ran, too late for its Connection: close), or its node of many is not live
// any more, c closes once the response is out.
func (l *Listener) handled(c *sessionConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.handlers.Add(-1)
	if c.h2 != nil {
		l.handledH2Locked(c)
		return
	}
	if !c.closableIdle() {
		return
	}
	if c.evicted.Load() {
		c.closeIdle() // its node is not live: closed after its response
		return
	}
	if !l.counts.claimRetirement() {
		return
	}
	l.retiredLocked(c)
	c.closeIdle()
	l.notifyLocked()
	l.log.Debug("retiring session after its response: closing it")
}

// handledH2Locked is handled for an HTTP/2 session: the handler has returned but its
// response may still be on its way (its last frames are written after the handler), so a
// session its node no longer wants, or that claims an owed retirement now, closes once its
// last stream is closed. l.mu must be held.
func (l *Listener) handledH2Locked(c *sessionConn) {
	switch {
	case c.upgrading.Load() || c.handlers.Load() > 0:
		return
	case c.evicted.Load() || c.retired.Load():
		c.closeWhenIdle()
	case l.counts.claimRetirement():
		l.retiredLocked(c)
		c.closeWhenIdle()
		l.notifyLocked()
		l.log.Debug("retiring session once its streams end")
	}
}

// retireIdleLocked closes idle sessions while retirements are owed; l.mu must be held. Only
// with Handler in use does the Listener know which sessions are idle.
func (l *Listener) retireIdleLocked() {
	if !l.wrapped.Load() {
		return
	}
	for c := range l.live {
		if l.counts.retire == 0 {
			return
		}
		if !c.closableIdle() || c.evicted.Load() || !l.counts.claimRetirement() {
			continue
		}
		l.retiredLocked(c)
		c.closeIdle()
		l.notifyLocked()
		l.log.Debug("retiring idle session: closing it")
	}
}

// retiredLocked marks c retired by a shrink; at a node of many it no longer counts as held
// there, so the split does not ask the node to retire it too. l.mu must be held.
func (l *Listener) retiredLocked(c *sessionConn) {
	c.retired.Store(true)
	if c.node != nil {
		c.node.shrinking++
	}
}
