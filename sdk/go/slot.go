package sluice

import (
	"context"
	"errors"
	"time"
)

// runSlot keeps one session registered: dial, register, hand the session to Accept, wait until
// it is closed, then dial a replacement, until the slot is retired, stopped or refused for
// good. While an operator holds the instance drained, it waits for its turn to probe.
func (l *Listener) runSlot(id int) {
	log := l.log.With("slot", id)
	defer l.slotEnded()
	failures := 0
	for {
		turn, ok := l.awaitTurn()
		if !ok {
			return
		}
		var pause time.Duration
		conn, rest, err := turn.dialer(l).register(l.dialCtx, l.capacity())
		switch {
		case errors.Is(err, context.Canceled):
			l.dialFailed(turn, err)
			return // Close
		case err != nil:
			if !l.dialFailed(turn, err) {
				return
			}
			// With many nodes the node backs off, not the slot: it may dial another at once.
			if !turn.probe && !isDrained(err) && turn.node == nil {
				pause = l.opts.Backoff.Delay(failures)
				failures++
			}
		default:
			l.registeredOn(turn)
			log.Debug("session registered", "probe", turn.probe, "node", turn.node.String())
			c := newSessionConn(l, conn, rest)
			c.node = turn.node
			end := l.serve(c)
			log.Debug("session ended", "retired", end.retired, "served", end.served, "moved", end.moved)
			switch {
			case end.retired:
				return
			case end.served || end.moved:
				// A session its node retired, or closed here because its node is not live,
				// is not a failure: dial a replacement elsewhere at once.
				failures = 0
			case turn.node == nil:
				// Closed before serving anything: back off as for a failed dial, so that a
				// proxy that accepts and drops sessions is not re-dialed in a tight loop
				// (with many nodes, serve made that node back off).
				pause = l.opts.Backoff.Delay(failures)
				failures++
			}
		}
		if pause > 0 && l.wait(pause) {
			return
		}
	}
}

// capacity is the capacity asked for now, as a registration declares it.
func (l *Listener) capacity() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts.target
}

// turn is one dial a slot may make: at epoch of the outage report, whether it is the drained
// instance's probe, and the node of many it dials (which counts it as held).
type turn struct {
	epoch int
	probe bool
	node  *node
}

func (t turn) dialer(l *Listener) *dialer {
	if t.node != nil {
		return t.node.dialer
	}
	return l.dialer
}

// awaitTurn waits until the slot may dial: at once, unless an operator holds the instance
// drained, when one slot at a time probes every Options.DrainedProbe; with many nodes, once a
// node has room for one more session and the sessions held everywhere are fewer than the
// capacity. It returns false when the slot should end instead.
func (l *Listener) awaitTurn() (turn, bool) {
	for {
		l.mu.Lock()
		if l.shouldEndLocked() {
			l.mu.Unlock()
			return turn{}, false
		}
		t, wait, ok := l.turnLocked(l.opts.clock.Now())
		changed := l.changed
		l.mu.Unlock()
		if ok {
			return t, true
		}
		l.sleep(wait, changed)
	}
}

// turnLocked is the dial the slot may make now, or how long to wait for one (0: until a
// change); l.mu must be held.
func (l *Listener) turnLocked(now time.Time) (turn, time.Duration, bool) {
	if l.dialer == nil {
		n, wait := l.pickLocked(now)
		if n == nil {
			return turn{}, wait, false
		}
		return turn{epoch: n.report.epoch, node: n}, 0, true
	}
	if l.held == nil {
		return turn{epoch: l.report.epoch}, 0, true
	}
	if l.probing {
		return turn{}, 0, false
	}
	if now.Before(l.nextProbe) {
		return turn{}, l.nextProbe.Sub(now), false
	}
	l.probing = true
	l.nextProbe = now.Add(l.opts.DrainedProbe)
	return turn{probe: true}, 0, true
}

// sleep waits for a change, or wait if positive; it reports whether the time ran out.
func (l *Listener) sleep(wait time.Duration, changed <-chan struct{}) bool {
	if wait <= 0 {
		<-changed
		return false
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-changed:
		return false
	case <-timer.C:
		return true
	}
}

// dialFailed records a failed dial and reports whether the slot goes on: a 410 holds the
// instance (the slots wait for the probe), 400, 401 and 404 stop the slot for good, anything
// else is retried after a backoff.
func (l *Listener) dialFailed(t turn, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.notifyLocked()
	if t.node != nil {
		return l.nodeDialFailedLocked(t, err)
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if t.probe {
		l.probing = false
	}
	l.lastErr = err
	switch {
	case isDrained(err):
		if l.held == nil && !l.counts.stopping {
			l.held = err
			l.nextProbe = l.opts.clock.Now().Add(l.opts.DrainedProbe)
			l.report.held(err, l.opts.DrainedProbe)
		}
		return true
	case !IsRetryable(err):
		l.report.refusedForGood(err)
		l.counts.slotFailed()
		return false
	case !t.probe && !l.counts.stopping:
		l.report.dialFailed(err, t.epoch)
	}
	return true
}

// nodeDialFailedLocked is dialFailed for a node of many: the reservation is released; a 410
// holds the instance out at that node only (its link probes); 400, 401 and 404 stop the slot
// as with one acceptor (the token and service are the same for every node); anything else
// makes the node back off.
func (l *Listener) nodeDialFailedLocked(t turn, err error) bool {
	n := t.node
	n.sessions--
	n.dialing = max(n.dialing-1, 0)
	switch {
	case errors.Is(err, context.Canceled):
		return false
	case isDrained(err):
		l.nodeHeldLocked(n, err)
	case !IsRetryable(err):
		l.lastErr = err
		l.report.refusedForGood(err)
		l.counts.slotFailed()
		l.planLocked()
		return false
	default:
		l.lastErr = err
		if !l.counts.stopping {
			n.report.dialFailed(err, t.epoch)
		}
		l.nodeFailedLocked(n)
		l.refusedLocked(n, err)
	}
	return true
}

// registeredOn: the slot's dial registered a session. A probe's session ends the drain hold:
// an operator resumed the instance, and every other slot dials at once.
func (l *Listener) registeredOn(t turn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := t.node; n != nil {
		n.failures, n.retryAt = 0, time.Time{}
		n.dialing = max(n.dialing-1, 0)
		n.report.registered()
		l.notifyLocked()
		return
	}
	if t.probe {
		l.probing = false
		if l.held != nil {
			l.held = nil
			l.report.resumed()
		}
	}
	l.report.registered()
	l.notifyLocked()
}

// serve hands a registered session to Accept and waits until it is closed. Once Accept is
// closed it closes the session instead: no session may reach Accept after Close.
func (l *Listener) serve(conn *sessionConn) ended {
	l.mu.Lock()
	if l.acceptClosed {
		l.leftNodeLocked(conn)
		l.notifyLocked()
		l.mu.Unlock()
		conn.Close()
		return ended{}
	}
	l.openedLocked(conn)
	l.mu.Unlock()
	select {
	case l.accept <- conn:
	case <-l.closed:
		conn.Close()
	}
	<-conn.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closedLocked(conn)
}

// openedLocked counts a registered session as live, at its node if it has one; l.mu must be
// held.
func (l *Listener) openedLocked(c *sessionConn) {
	l.live[c] = struct{}{}
	l.registered++
	l.joinedNodeLocked(c)
	// A shrink while this session was registering: it retires at once, idle as it is.
	l.retireIdleLocked()
	l.notifyLocked()
}

// closedLocked counts a live session closed and says how it ended; l.mu must be held.
func (l *Listener) closedLocked(c *sessionConn) ended {
	delete(l.live, c)
	l.registered--
	end := ended{retired: c.retired.Load(), served: c.served.Load()}
	end.moved = l.leftNodeLocked(c)
	if c.node != nil && !end.retired && !end.served && !end.moved {
		l.nodeFailedLocked(c.node) // closed unused: that node backs off
	}
	l.notifyLocked()
	return end
}

// ended is how a session ended: retired (a shrink: the slot ends), served (it carried a
// request), moved (its node retired it, or the SDK closed it because of its node).
type ended struct{ retired, served, moved bool }

// joinedNodeLocked lists a session at its node; one that registered at a node that is no
// longer live is closed at once, as the node's others were.
func (l *Listener) joinedNodeLocked(c *sessionConn) {
	if n := c.node; n != nil {
		n.members[c] = struct{}{}
		if !n.live() {
			l.settleLocked(n)
		}
	}
}

// leftNodeLocked counts a session that ended out of its node; it reports whether the session
// was on its way out (retired by the node or closed by the SDK for its node).
func (l *Listener) leftNodeLocked(c *sessionConn) (moved bool) {
	n := c.node
	if n == nil {
		return false
	}
	delete(n.members, c)
	n.sessions--
	switch {
	case c.evicted.Load():
		n.evicting--
		moved = true
	case c.retired.Load():
		n.shrinking--
	case n.retiring > 0:
		n.retiring--
		moved = true
	case n.draining:
		moved = true // the stopping node closed it: dial elsewhere at once
	}
	if n.gone && n.sessions == 0 {
		l.forgetGoneLocked()
	}
	return moved
}

// wait sleeps for pause; it returns true early if the slot should end meanwhile (stopping,
// or a retirement it claimed).
func (l *Listener) wait(pause time.Duration) bool {
	timer := time.NewTimer(pause)
	defer timer.Stop()
	for {
		l.mu.Lock()
		end := l.shouldEndLocked()
		changed := l.changed
		l.mu.Unlock()
		if end {
			return true
		}
		select {
		case <-timer.C:
			return false
		case <-changed:
		}
	}
}

// shouldEnd: a slot about to dial ends instead when stopping or when a retirement is owed.
func (l *Listener) shouldEnd() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.shouldEndLocked()
}

func (l *Listener) shouldEndLocked() bool {
	if l.counts.stopping {
		return true
	}
	if l.counts.claimRetirement() {
		l.notifyLocked()
		return true
	}
	return false
}

func (l *Listener) slotEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	l.notifyLocked()
}
