package sluice

import (
	"errors"
	"log/slog"
	"time"
)

// report is what an instance logs (protocol/README.md "What SDKs log"): per instance (or per
// node of many), never per session slot or per attempt. An outage is one warning and, once a
// session registers again, one info line with its length and its failed dials; a refusal that
// stops the slots is one error line; an operator's drain hold is one warning and its end one
// info line; a capacity change is one info line. Its methods run under the Listener's lock.
type report struct {
	log *slog.Logger
	// epoch grows whenever an outage ends: a dial begun before that belongs to the outage
	// that ended, and its failure starts no new one.
	epoch int
	// outage is the outage going on, if any.
	outage *outage
	// heldSince is when an operator's drain (410) began holding the instance; zero when not.
	heldSince time.Time
	// refused: a refusal that stops the slots was logged, until the capacity is set again.
	refused bool
}

type outage struct {
	since  time.Time
	failed int
}

// dialFailed: a retryable dial begun at epoch failed. The first failure of an outage is a
// warning; the rest are counted for the line that ends it.
func (r *report) dialFailed(err error, epoch int) {
	if epoch != r.epoch {
		return
	}
	if r.outage != nil {
		r.outage.failed++
		return
	}
	r.outage = &outage{since: time.Now(), failed: 1}
	r.log.Warn("cannot register with the acceptor; re-dialing with backoff (logged once per outage)", "error", err)
}

// registered: a session registered, which ends an outage (one info line).
func (r *report) registered() {
	if r.outage == nil {
		return
	}
	o := r.outage
	r.outage = nil
	r.epoch++
	r.log.Info("registered with the acceptor again", "outage", time.Since(o.since).Round(time.Millisecond), "failed_dials", o.failed)
}

// refusedForGood: a refusal (400, 401, 404) stopped the slots; logged once until the capacity
// is set again.
func (r *report) refusedForGood(err error) {
	if r.refused {
		return
	}
	r.refused = true
	var e *Error
	if errors.As(err, &e) && e.Kind == KindUnsupported {
		r.log.Error("the acceptor does not take HTTP/2 sessions (Options.Streams); its sessions stop until the capacity is set again", "error", err)
		return
	}
	r.log.Error("the acceptor refused this instance; its sessions stop until the capacity is set again", "error", err)
}

// held: 410, an operator drained the instance; the slots wait and one probe dials every
// probe. It ends an outage without a line: the acceptor answered.
func (r *report) held(err error, probe time.Duration) {
	r.outage = nil
	r.epoch++
	r.heldSince = time.Now()
	r.log.Warn("this instance is drained; its sessions stop and one registration probes until `sluice ctl resume`", "error", err, "probe_every", probe)
}

// resumed: a probe registered while held.
func (r *report) resumed() {
	r.log.Info("the instance was resumed: registered again", "drained_for", time.Since(r.heldSince).Round(time.Millisecond))
	r.heldSince = time.Time{}
}

// capacity: the capacity asked for changed. Setting it again also re-arms the refusal line,
// since it restarts the slots a refusal stopped.
func (r *report) capacity(old, new int, wasHeld bool) {
	r.refused = false
	if wasHeld {
		r.heldSince = time.Time{}
		r.log.Info("capacity set while drained: dialing again at once", "capacity", new)
	}
	if old != new {
		r.log.Info("capacity changed", "old", old, "new", new)
	}
}
