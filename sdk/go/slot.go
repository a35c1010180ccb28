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
		conn, rest, err := l.dialer.register(l.dialCtx, l.Status().Capacity)
		switch {
		case errors.Is(err, context.Canceled):
			return // Close
		case err != nil:
			if !l.dialFailed(turn, err) {
				return
			}
			if !turn.probe && !isDrained(err) {
				pause = l.opts.Backoff.Delay(failures)
				failures++
			}
		default:
			l.registeredOn(turn)
			log.Debug("session registered", "probe", turn.probe)
			retired, served := l.serve(newSessionConn(l, conn, rest))
			log.Debug("session ended", "retired", retired, "served", served)
			if retired {
				return
			}
			if served {
				failures = 0
			} else {
				// Closed before serving anything: back off as for a failed dial, so that a
				// proxy that accepts and drops sessions is not re-dialed in a tight loop.
				pause = l.opts.Backoff.Delay(failures)
				failures++
			}
		}
		if pause > 0 && l.wait(pause) {
			return
		}
	}
}

// turn is one dial a slot may make: at epoch of the outage report, and whether it is the
// drained instance's probe.
type turn struct {
	epoch int
	probe bool
}

// awaitTurn waits until the slot may dial: at once, unless an operator holds the instance
// drained, when one slot at a time probes every Options.DrainedProbe. It returns false when
// the slot should end instead.
func (l *Listener) awaitTurn() (turn, bool) {
	for {
		l.mu.Lock()
		if l.shouldEndLocked() {
			l.mu.Unlock()
			return turn{}, false
		}
		t, wait, ok := l.turnLocked(time.Now())
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
	if t.probe {
		l.probing = false
	}
	l.lastErr = err
	switch {
	case isDrained(err):
		if l.held == nil && !l.counts.stopping {
			l.held = err
			l.nextProbe = time.Now().Add(l.opts.DrainedProbe)
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

// registeredOn: the slot's dial registered a session. A probe's session ends the drain hold:
// an operator resumed the instance, and every other slot dials at once.
func (l *Listener) registeredOn(t turn) {
	l.mu.Lock()
	defer l.mu.Unlock()
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
func (l *Listener) serve(conn *sessionConn) (retired, served bool) {
	l.mu.Lock()
	if l.acceptClosed {
		l.mu.Unlock()
		conn.Close()
		return false, false
	}
	l.live[conn] = struct{}{}
	l.registered++
	// A shrink while this session was registering: it retires at once, idle as it is.
	l.retireIdleLocked()
	l.notifyLocked()
	l.mu.Unlock()
	select {
	case l.accept <- conn:
	case <-l.closed:
		conn.Close()
	}
	<-conn.done
	l.mu.Lock()
	delete(l.live, conn)
	l.registered--
	l.notifyLocked()
	l.mu.Unlock()
	return conn.retired.Load(), conn.served.Load()
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
