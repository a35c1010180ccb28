package sluice

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"
	"unicode"
)

// errClosedEarly: the acceptor hung up before its answer's head was complete.
var errClosedEarly = fmt.Errorf("the acceptor closed the connection before answering: %w", io.ErrUnexpectedEOF)

// keepAliveIdle is how long a session may sit silent before the kernel probes it: sessions
// idle for long stretches, and keepalive finds one whose peer vanished.
const keepAliveIdle = 30 * time.Second

// dialer opens connections to the acceptor and runs the handshakes.
type dialer struct {
	network, address string
	tls              *tls.Config
	id               identity
	timeout          time.Duration
	// streams above 0 registers HTTP/2 sessions of that many streams (Options.Streams).
	streams int
}

func newDialer(o *Options) *dialer {
	network, address, _ := o.endpoint() // validated by Listen
	host, _, _ := net.SplitHostPort(address)
	return newDialerTo(o, network, address, host)
}

// newNodeDialer dials one node of many; host (the dns: name or the list entry's host) is the
// TLS server name unless Options.TLS names one.
func newNodeDialer(o *Options, addr netip.AddrPort, host string) *dialer {
	return newDialerTo(o, "tcp", addr.String(), strings.Trim(host, "[]"))
}

func newDialerTo(o *Options, network, address, host string) *dialer {
	d := &dialer{network: network, address: address, id: o.identity(), timeout: o.HandshakeTimeout, streams: o.Streams}
	if o.TLS != nil {
		d.tls = o.TLS.Clone()
		if d.tls.ServerName == "" && network == "tcp" {
			d.tls.ServerName = host
		}
	}
	return d
}

// errNoControl: the node answered the control link's request with 400, as an acceptor that
// does not know control links does.
var errNoControl = errors.New("the acceptor does not know control links (400)")

// control dials a control link (many nodes) declaring capacity. It returns the connection and
// the bytes read past the 101 head (the link's first lines), errNoControl for a 400, or the
// refusal.
func (d *dialer) control(ctx context.Context, capacity int) (net.Conn, []byte, error) {
	conn, rep, rest, err := d.exchange(ctx, "control", encodeControl(d.id, capacity, splitByService), controlToken)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case rep.kind == replySwitched:
		return conn, rest, nil
	case rep.kind == replyRefused && rep.status == 400:
		conn.Close()
		return nil, nil, errNoControl
	case rep.kind == replyRefused:
		defer conn.Close()
		return nil, nil, &Error{Op: "control", Kind: KindRefused, Status: rep.status, Reason: readReason(conn, rest)}
	}
	conn.Close()
	return nil, nil, &Error{Op: "control", Kind: KindProtocol, Err: errors.New("200 to a control link")}
}

// errNoHTTP2: a 101 to an HTTP/2 registration without Sluice-Protocol: h2, as an acceptor
// older than HTTP/2 sessions answers. Speaking HTTP/2 to it would fail on the first request.
var errNoHTTP2 = errors.New("the acceptor does not take HTTP/2 sessions (its 101 does not name Sluice-Protocol: h2)")

// register dials and registers one session; capacity goes into Sluice-Capacity, and the
// dialer's streams make it an HTTP/2 session. It returns the connection and the bytes read
// past the 101 head.
func (d *dialer) register(ctx context.Context, capacity int) (net.Conn, []byte, error) {
	conn, rep, rest, err := d.exchange(ctx, "register", encodeRegistration(d.id, capacity, d.streams), upgradeToken)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case rep.kind == replySwitched && rep.h2 == (d.streams > 0):
		return conn, rest, nil
	case rep.kind == replySwitched && d.streams > 0:
		conn.Close()
		return nil, nil, &Error{Op: "register", Kind: KindUnsupported, Err: errNoHTTP2}
	case rep.kind == replySwitched:
		conn.Close()
		return nil, nil, &Error{Op: "register", Kind: KindProtocol, Err: errors.New("an HTTP/2 session's 101 to an HTTP/1.1 registration")}
	}
	switch rep.kind {
	case replyRefused:
		defer conn.Close()
		return nil, nil, &Error{Op: "register", Kind: KindRefused, Status: rep.status, Reason: readReason(conn, rest)}
	}
	conn.Close()
	return nil, nil, &Error{Op: "register", Kind: KindProtocol, Err: errors.New("200 to a registration")}
}

// drain sends `POST /.sluice/v1/drain` for the instance on a new connection and expects 200.
func (d *dialer) drain(ctx context.Context) error {
	conn, rep, rest, err := d.exchange(ctx, "drain", encodeDrain(d.id), upgradeToken)
	if err != nil {
		return err
	}
	defer conn.Close()
	switch rep.kind {
	case replyDrained:
		return nil
	case replyRefused:
		return &Error{Op: "drain", Kind: KindRefused, Status: rep.status, Reason: readReason(conn, rest)}
	}
	return &Error{Op: "drain", Kind: KindProtocol, Err: errors.New("101 to a drain request")}
}

// exchange connects, writes req and reads the reply head (a 101 must name protocol), all
// within the handshake timeout. On success the connection is open, without deadline.
func (d *dialer) exchange(ctx context.Context, op string, req []byte, protocol string) (net.Conn, reply, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	conn, err := d.connect(ctx, op)
	if err != nil {
		return nil, reply{}, nil, err
	}
	// A past deadline unblocks the reads and writes below when ctx ends.
	unblock := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	rep, rest, err := d.talk(conn, op, req, protocol)
	if !unblock() || err != nil {
		conn.Close()
		return nil, reply{}, nil, d.ctxError(ctx, op, err)
	}
	return conn, rep, rest, nil
}

func (d *dialer) talk(conn net.Conn, op string, req []byte, protocol string) (reply, []byte, error) {
	if _, err := conn.Write(req); err != nil {
		return reply{}, nil, &Error{Op: op, Kind: KindIO, Err: err}
	}
	return readReply(conn, op, protocol)
}

// ctxError prefers the context's verdict: an I/O error caused by the deadline is a timeout.
func (d *dialer) ctxError(ctx context.Context, op string, err error) error {
	switch ctx.Err() {
	case context.DeadlineExceeded:
		return &Error{Op: op, Kind: KindTimeout, Err: errors.New("no answer within " + d.timeout.String())}
	case context.Canceled:
		return context.Canceled
	}
	return err
}

func (d *dialer) connect(ctx context.Context, op string) (net.Conn, error) {
	nd := net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: keepAliveIdle}}
	conn, err := nd.DialContext(ctx, d.network, d.address)
	if err != nil {
		if ctx.Err() != nil {
			return nil, d.ctxError(ctx, op, err)
		}
		return nil, &Error{Op: op, Kind: KindConnect, Err: err}
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetNoDelay(true) // the default in Go; said here because latency depends on it
	}
	if d.tls == nil {
		return conn, nil
	}
	tc := tls.Client(conn, d.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, d.ctxError(ctx, op, err)
		}
		return nil, &Error{Op: op, Kind: KindTLS, Err: err}
	}
	return tc, nil
}

// readReply reads the answer's head (at most maxReplyHead bytes in all) and returns it with
// whatever was read past it.
func readReply(conn net.Conn, op, protocol string) (reply, []byte, error) {
	buf := make([]byte, maxReplyHead)
	n := 0
	for {
		m, readErr := conn.Read(buf[n:])
		n += m
		rep, head, err := parseReply(buf[:n], protocol)
		switch {
		case err == nil:
			return rep, append([]byte(nil), buf[head:n]...), nil
		case !errors.Is(err, errPartial):
			return reply{}, nil, &Error{Op: op, Kind: KindProtocol, Err: err}
		case readErr == io.EOF:
			return reply{}, nil, &Error{Op: op, Kind: KindIO, Err: errClosedEarly}
		case readErr != nil:
			return reply{}, nil, &Error{Op: op, Kind: KindIO, Err: readErr}
		}
	}
}

// maxReason bounds the reason read from a refusal's body.
const maxReason = 512

// reasonWait bounds the wait for a refusal's body after its head: the acceptor sends both at
// once and closes, and anything else may never end its body.
const reasonWait = 250 * time.Millisecond

// readReason is the first line of a refusal's body (rest, then what follows on conn), as
// printable text.
func readReason(conn net.Conn, rest []byte) string {
	body := append([]byte(nil), rest...)
	conn.SetReadDeadline(time.Now().Add(reasonWait))
	buf := make([]byte, maxReason)
	for len(body) < maxReason && !bytes.Contains(body, []byte("\n")) {
		n, err := conn.Read(buf)
		body = append(body, buf[:n]...)
		if err != nil {
			break
		}
	}
	line, _, _ := strings.Cut(string(body[:min(len(body), maxReason)]), "\n")
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return -1
	}, strings.TrimSpace(line))
}
