package sluice

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// rebalanceLog logs each rebalance of many nodes as one info line (what moved where, with the
// demands), at most one a second: a rebalance within the second after a line is logged at
// its end, with the moves in between summed. Its methods run under the Listener's lock.
type rebalanceLog struct {
	last    time.Time
	logged  string         // the targets last logged
	pending map[string]int // sessions moved off each node since the last line
	due     bool           // a line is due at the end of the second
}

// planned: a plan set targets and moved sessions off some nodes.
func (r *rebalanceLog) planned(l *Listener, moves map[*node]int) {
	if len(moves) == 0 && (targetsOf(l) == r.logged || !anyTarget(l)) || anyPending(l) {
		return
	}
	if r.pending == nil {
		r.pending = make(map[string]int)
	}
	for n, k := range moves {
		r.pending[n.addr.String()] += k
	}
	wait := time.Second - l.opts.clock.Now().Sub(r.last)
	if wait <= 0 {
		r.flush(l)
		return
	}
	if !r.due {
		r.due = true
		l.opts.clock.AfterFunc(wait, func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			r.due = false
			r.flush(l)
		})
	}
}

// flush logs the line: every node with its demand, holding and target, and the moves.
func (r *rebalanceLog) flush(l *Listener) {
	r.last = l.opts.clock.Now()
	r.logged = targetsOf(l)
	var nodes, moved []string
	for _, n := range l.nodes {
		state := "live"
		if !n.live() {
			state = n.why()
		}
		nodes = append(nodes, fmt.Sprintf("%s %s d=%.2f h=%d t=%d", n.addr, state, n.splitDemand(), n.holding(), n.target))
	}
	for addr, k := range r.pending {
		moved = append(moved, fmt.Sprintf("%s -%d", addr, k))
	}
	sort.Strings(moved)
	clear(r.pending)
	l.log.Info("rebalance", "capacity", l.counts.target, "nodes", strings.Join(nodes, "; "), "moved_off", strings.Join(moved, ", "))
}

func targetsOf(l *Listener) string {
	var b strings.Builder
	for _, n := range l.nodes {
		fmt.Fprintf(&b, "%s=%d ", n.addr, n.target)
	}
	return b.String()
}

// anyTarget: some node has a share; before any node is live there is nothing to say.
func anyTarget(l *Listener) bool {
	for _, n := range l.nodes {
		if n.target > 0 {
			return true
		}
	}
	return false
}

// anyPending: a node just joined and has not answered yet; the split is not settled.
func anyPending(l *Listener) bool {
	now := l.opts.clock.Now()
	for _, n := range l.nodes {
		if n.pendingUntil.After(now) {
			return true
		}
	}
	return false
}
