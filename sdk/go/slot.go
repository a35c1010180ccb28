package sluice

import (
	"context"
	"errors"
	"time"
)

// runSlot keeps one session registered: dial, register, hand the session to Accept, wait until
// it is closed, then dial a replacement, until the slot is retired, stopped or refused for
// good.
func (l *Listener) runSlot(id int) {
	log := l.log.With("slot", id)
	defer l.slotEnded()
	failures := 0
	for !l.shouldEnd() {
		var pause time.Duration
		conn, rest, err := l.dialer.register(l.dialCtx, l.Status().Capacity)
		switch {
		case errors.Is(err, context.Canceled):
			return // Close
		case err != nil && isDrained(err):
			log.Warn("this instance is drained; not re-dialing until it is resumed", "error", err)
			l.slotFailed(err)
			return
		case err != nil && !IsRetryable(err):
			log.Error("the acceptor refused this instance; not retrying", "error", err)
			l.slotFailed(err)
			return
		case err != nil:
			log.Warn("dial failed; backing off", "error", err, "attempt", failures)
			l.record(err)
			pause = l.opts.Backoff.Delay(failures)
			failures++
		default:
			log.Debug("session registered")
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

func (l *Listener) record(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
	l.notifyLocked()
}

func (l *Listener) slotFailed(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
	l.counts.slotFailed()
	l.notifyLocked()
}

func (l *Listener) slotEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.running--
	l.notifyLocked()
}
