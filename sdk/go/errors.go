package sluice

import (
	"errors"
	"fmt"
	"syscall"
)

// Kind says where a dial or handshake failed.
type Kind int

const (
	// KindConnect: the acceptor could not be reached (network; retried).
	KindConnect Kind = iota + 1
	// KindTLS: the TLS handshake with the acceptor failed (network or certificates; retried).
	KindTLS
	// KindTimeout: connecting plus the answer took longer than HandshakeTimeout (retried).
	KindTimeout
	// KindRefused: the acceptor answered with a refusal status; see [Error.Retryable].
	KindRefused
	// KindProtocol: the acceptor's answer is not the session protocol (upstream; retried).
	KindProtocol
	// KindIO: reading or writing the handshake failed (network; retried).
	KindIO
	// KindUnsupported: the acceptor switched protocols but does not take what was asked,
	// such as HTTP/2 sessions (Options.Streams) from an acceptor older than them; not
	// retried: the deployment must change.
	KindUnsupported
)

// String is the kind's lower-case name, as in error messages.
func (k Kind) String() string {
	switch k {
	case KindConnect:
		return "connect"
	case KindTLS:
		return "tls"
	case KindTimeout:
		return "timeout"
	case KindRefused:
		return "refused"
	case KindProtocol:
		return "protocol"
	case KindIO:
		return "io"
	case KindUnsupported:
		return "unsupported"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Error is a failed registration or drain: what was tried, where it failed and, for a
// refusal, the acceptor's status.
type Error struct {
	// Op is "register", "drain" or "control" (a node's control link, with many nodes).
	Op string
	// Kind says where it failed.
	Kind Kind
	// Status is the acceptor's HTTP status for KindRefused, else 0.
	Status int
	// Reason is the acceptor's reason for KindRefused (the first line of its answer's body,
	// printable text only), such as `unknown service "nosuch"`; "" when it gave none.
	Reason string
	// Err is the underlying cause, when there is one.
	Err error
}

// Error says what failed and where, and "(not retried)" when the slot stopped for good.
func (e *Error) Error() string {
	msg := "sluice: " + e.Op + ": "
	switch {
	case e.Kind == KindRefused && e.Reason != "":
		msg += fmt.Sprintf("the acceptor refused with status %d: %s", e.Status, e.Reason)
	case e.Kind == KindRefused:
		msg += fmt.Sprintf("the acceptor refused with status %d (no reason given)", e.Status)
	case e.Err != nil:
		msg += e.Kind.String() + ": " + e.Err.Error()
	default:
		msg += e.Kind.String()
	}
	if !e.Retryable() {
		msg += " (not retried: " + hint(e) + ")"
	}
	return msg
}

// Unwrap returns the underlying cause, or nil.
func (e *Error) Unwrap() error { return e.Err }

// Retryable reports whether dialing again may succeed: false for refusals with 400, 401 and
// 404 (the configuration is wrong), 410 (an operator drained the instance until
// `sluice ctl resume`; the slots wait and one probe dials every Options.DrainedProbe) and
// KindUnsupported (an acceptor without HTTP/2 sessions), true for everything else.
func (e *Error) Retryable() bool {
	if e.Kind == KindUnsupported {
		return false
	}
	return e.Kind != KindRefused || !permanent(e.Status)
}

// hint says which option to fix for an error that stops the slot.
func hint(e *Error) string {
	if e.Kind == KindUnsupported {
		return "upgrade Sluice to one that takes HTTP/2 sessions, or set Options.Streams to 0"
	}
	switch e.Status {
	case 401:
		return "check Options.Token"
	case 404:
		return "check Options.Service against the proxy's reverse clusters"
	case 410:
		return "the instance is drained; after sluice ctl resume, a probe registers again within Options.DrainedProbe"
	}
	return "check the identity in Options"
}

func permanent(status int) bool {
	return status == 400 || status == 401 || status == 404 || status == 410
}

// Drained reports whether the acceptor refused because an operator drained this instance
// (410 Gone): its slots wait, and one registration probes every Options.DrainedProbe until
// `sluice ctl resume` lets it register again.
func (e *Error) Drained() bool {
	return e.Kind == KindRefused && e.Status == 410
}

// IsRetryable reports whether err is an [*Error] that may succeed when tried again.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable()
}

func isDrained(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Drained()
}

// isConnRefused: the connect itself was refused (ECONNREFUSED), so nothing listens at the
// address, as after its process died; a timeout or a reset says less.
func isConnRefused(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == KindConnect && errors.Is(e.Err, syscall.ECONNREFUSED)
}
