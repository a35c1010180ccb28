package sluice

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"time"
)

// link is a node's control link while it is up: the node's lines are read by runLink, the
// instance's are queued on out and written by one goroutine, in order.
type link struct {
	conn net.Conn
	out  chan string
	done chan struct{} // closed when the link ends
}

// send queues a line; a link too slow to take it is closed (and dialed again).
func (k *link) send(line string) {
	select {
	case k.out <- line:
	default:
		k.conn.Close()
	}
}

func (k *link) write(timeout time.Duration) {
	for {
		select {
		case line := <-k.out:
			k.conn.SetWriteDeadline(time.Now().Add(timeout))
			if _, err := io.WriteString(k.conn, line); err != nil {
				k.conn.Close()
				return
			}
		case <-k.done:
			return
		}
	}
}

// runLink keeps n's control link: dial, read its lines until it ends or is silent for 3 s,
// dial again at once and then with backoff (a redial refused means the node is gone: down at
// once, see refusedLocked). A node that answers 400 has no control links
// (live with demand 1, the link retried at the backoff's maximum); 410 holds the instance out
// at that node (retried every DrainedProbe); 401 and 404 keep it out (retried at the backoff's
// maximum). It returns when ctx ends: the Listener closes, or the node is forgotten.
func (l *Listener) runLink(ctx context.Context, n *node) {
	failures := 0
	for ctx.Err() == nil {
		l.mu.Lock()
		capacity, epoch := l.counts.target, n.report.epoch
		l.mu.Unlock()
		conn, rest, err := n.dialer.control(ctx, capacity)
		var pause time.Duration
		switch {
		case ctx.Err() != nil:
			if conn != nil {
				conn.Close()
			}
			return
		case err == nil:
			if l.serveLink(ctx, n, conn, rest) {
				failures = 0
				continue // it worked for a while: dial again at once
			}
			pause = l.opts.Backoff.Delay(failures)
			failures++
		case errors.Is(err, errNoControl):
			l.linkAnswered(n, nil)
			pause = l.opts.Backoff.Max
		case isDrained(err):
			l.mu.Lock()
			l.nodeHeldLocked(n, err)
			l.mu.Unlock()
			pause = l.opts.DrainedProbe
		case !IsRetryable(err):
			l.nodeRefused(n, err)
			pause = l.opts.Backoff.Max
		default:
			l.linkFailed(n, err, epoch)
			pause = l.opts.Backoff.Delay(failures)
			failures++
		}
		sleepCtx(ctx, pause)
	}
}

// sleepCtx waits for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
	}
}

// serveLink runs an answered link until it ends; it reports whether the node sent a valid
// line on it (a link that ends before one backs off).
func (l *Listener) serveLink(ctx context.Context, n *node, conn net.Conn, rest []byte) bool {
	k := &link{conn: conn, out: make(chan string, 64), done: make(chan struct{})}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	l.linkAnswered(n, k)
	go k.write(l.opts.HandshakeTimeout)
	heard, err := l.readLink(n, k, rest)
	close(k.done)
	conn.Close()
	l.linkLost(n, k, err, ctx.Err() != nil)
	return heard
}

// readLink acts on the node's lines until the link ends, is silent for 3 s, or sends a line
// that is not the protocol's.
func (l *Listener) readLink(n *node, k *link, rest []byte) (heard bool, err error) {
	br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(rest), k.conn), 2*maxControlLine)
	for {
		k.conn.SetReadDeadline(time.Now().Add(l.opts.silence))
		text, err := readControlLine(br)
		if err != nil {
			return heard, err
		}
		line, err := parseNodeLine(text)
		if err != nil {
			return heard, err
		}
		heard = true
		l.heard(n, k, line)
	}
}

// heard acts on a node's line: DEMAND is smoothed into its demand (and, on a link newer than
// the one that said DRAINING, takes the node back); DRAINING takes it out. Both plan anew.
// FLOOR is kept for the next plan: the README plans on DEMAND, which follows within a second.
func (l *Listener) heard(n *node, k *link, line nodeLine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch line.verb {
	case verbFloor:
		n.noFloor = !line.floor
		return
	case verbDraining:
		n.pendingUntil = time.Time{}
		if !n.draining {
			n.log.Info("node is draining: its sessions move to the others")
		}
		n.draining, n.drainingOn = true, k
	default:
		if n.draining && n.drainingOn != k {
			n.draining = false
			n.log.Info("node takes sessions again")
		}
		n.demand = smooth(n.demand, n.sampled, line.demand.sample())
		n.asking = line.demand.sample() > 0
		n.sampled, n.pendingUntil = true, time.Time{}
	}
	l.planLocked()
}

// linkAnswered: the node answered the link's request with 101 (k) or, without control links,
// with 400 (k nil). Either way it is reachable: an outage, a hold or a refusal ends. A link
// plans nothing until its first DEMAND, which the node sends at once: a plan before it would
// move sessions by the demand and floor of the node's last link, and the hold of step 5
// could then keep the right move back for a second. Without control links there is no DEMAND
// to wait for.
func (l *Listener) linkAnswered(n *node, k *link) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k == nil && !n.noControl {
		n.log.Info("the node does not know control links (an older acceptor): it gets an even share")
	}
	n.link, n.noControl = k, k == nil
	n.lostAt, n.down, n.refused = time.Time{}, false, nil
	if n.held {
		n.held = false
		n.report.resumed()
	}
	// What the node still owes from an earlier link is unknown: plan from what is held. Its
	// floor is asked again: a new link counts on this instance until it says FLOOR 0.
	n.retiring, n.noFloor = 0, false
	n.report.registered()
	if k != nil {
		k.send(capacityLine(l.counts.target))
		l.notifyLocked()
		return
	}
	n.pendingUntil = time.Time{}
	l.planLocked()
}

// linkLost: k ended. The node stays live for NodeGrace, then is down; unless this side ended
// it (closed: the Listener closed, or the node left DNS), when nothing is lost.
func (l *Listener) linkLost(n *node, k *link, err error, closed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n.link != k {
		return
	}
	n.link, n.pendingUntil = nil, time.Time{}
	n.log.Debug("control link ended", "error", err)
	if closed {
		l.notifyLocked()
		return
	}
	l.suspectLocked()
	l.lostLocked(n)
}

// lostLocked starts the grace of a node that was reachable: silence, a timeout or a hot
// restart (which replaces the process behind the link while the sessions stay) may end
// within it. l.mu must be held.
func (l *Listener) lostLocked(n *node) {
	n.noControl = false
	n.lostAt = l.opts.clock.Now()
	lost := n.lostAt
	l.opts.clock.AfterFunc(l.opts.NodeGrace, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if n.up() || n.lostAt != lost || n.down {
			return
		}
		l.downLocked(n, "no control link within NodeGrace", "grace", l.opts.NodeGrace)
	})
	l.planLocked()
}

// refusedLocked: a dial to n was refused (ECONNREFUSED: nothing listens at its address). If
// its control link has closed too (or it is an older acceptor without links), the node is
// gone, so it is down at once rather than after NodeGrace: a hot restart passes the
// listening socket on, and connects to it queue rather than being refused. l.mu must be held.
func (l *Listener) refusedLocked(n *node, err error) {
	if n.down || n.link != nil || !isConnRefused(err) {
		return
	}
	if n.noControl {
		l.lostLocked(n)
	}
	if n.lostAt.IsZero() {
		return // never reached: not live yet, so there is nothing to move
	}
	l.downLocked(n, "its control link closed and it refuses connections", "error", err)
}

// downLocked takes n out: the split moves its share to the others and closes its sessions
// (idle ones at once). A node that said DRAINING was expected to go, so that is no warning.
// l.mu must be held.
func (l *Listener) downLocked(n *node, why string, attrs ...any) {
	n.down = true
	l.suspectLocked()
	if n.draining {
		n.log.Info("the draining node is gone: "+why, attrs...)
	} else {
		n.log.Warn("node down: "+why+"; its share moves to the others", attrs...)
	}
	l.planLocked()
}

// linkFailed: dialing the link failed (begun at the node's report epoch epoch). A node that
// said DRAINING is expected to go: its failed dials are no outage.
func (l *Listener) linkFailed(n *node, err error, epoch int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
	n.pendingUntil = time.Time{}
	if !l.counts.stopping && !n.draining {
		n.report.dialFailed(err, epoch)
	}
	if n.noControl {
		l.lostLocked(n)
	}
	l.refusedLocked(n, err)
	l.notifyLocked()
}

// nodeHeldLocked: the node answered 410, an operator drained this instance there; the link is
// dialed every DrainedProbe until it is answered again. l.mu must be held.
func (l *Listener) nodeHeldLocked(n *node, err error) {
	l.lastErr = err
	n.pendingUntil = time.Time{}
	if !n.held {
		n.held = true
		n.report.held(err, l.opts.DrainedProbe)
	}
	if n.link != nil {
		n.link.conn.Close() // its next dial is the probe
	}
	l.planLocked()
}

// nodeRefused: the link was refused with 401 or 404: the node is out, with one error line,
// until a link is answered again.
func (l *Listener) nodeRefused(n *node, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastErr = err
	n.pendingUntil = time.Time{}
	if n.refused == nil {
		n.log.Error("the node refused this instance's control link; it gets no sessions", "error", err)
	}
	n.refused = err
	l.planLocked()
}
