package sluice

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"time"
)

// ErrInvalidOptions is wrapped by every error Listen returns for options that could never
// register.
var ErrInvalidOptions = errors.New("sluice: invalid options")

// Options says where the acceptor is, who this instance is and how hard to try.
// Zero values take the documented defaults.
type Options struct {
	// Acceptor is the proxy's acceptor: "host:port", or "unix:/path" for a UNIX socket; a host
	// name is resolved again on every dial. Many nodes (protocol/README.md "Many nodes"):
	// "dns:NAME:PORT" (every A and AAAA record of NAME, such as a Kubernetes headless Service,
	// re-resolved every ResolveInterval) or a list "a:7070,b:7070". With many nodes the
	// instance dials every node, keeps a control link to each, and splits Capacity among them
	// by demand, never holding more than Capacity sessions in all. Acceptor or Acceptors is
	// required.
	Acceptor string
	// Acceptors is the list form of Acceptor: each entry "host:port", a name counting once per
	// address it resolves to. Set Acceptor or Acceptors, not both; one entry is the same as
	// Acceptor set to it.
	Acceptors []string
	// Service is the reverse cluster to join (Sluice-Service). Required.
	Service string
	// Slice is the slice the sessions join (Sluice-Slice); "" means "default".
	Slice string
	// Instance is the instance id (Sluice-Instance); "" sends none, and the proxy then uses
	// the peer's IP address. Set it to drain only this process on Shutdown.
	Instance string
	// Token is the bearer token (Authorization: Bearer); "" sends none.
	Token string
	// Capacity is how many sessions to keep registered; 0 means 1.
	Capacity int
	// Streams, from 1 to 1000, makes every session an HTTP/2 one (protocol/README.md
	// "HTTP/2 sessions"): registered with Sluice-Protocol: h2 and Sluice-Streams: Streams, it
	// carries up to Streams requests at once, so the instance takes Capacity × Streams. After
	// the 101 the session speaks HTTP/2 with prior knowledge, Sluice being the client: serve
	// the Listener with a server that does, such as grpc.NewServer().Serve(ln) or an
	// http.Server whose Protocols has SetUnencryptedHTTP2(true). 0 (the default) means
	// HTTP/1.1 sessions, one request at a time. An acceptor that does not take HTTP/2
	// sessions stops the slots with a KindUnsupported error.
	Streams int
	// TLS, when set, wraps every connection to the acceptor in TLS with this configuration
	// (its Certificates give mutual TLS). nil (the default) means plaintext. An empty
	// ServerName is taken from Acceptor's host; a UNIX acceptor needs one set.
	TLS *tls.Config
	// Backoff spaces out failed dials; zero fields take their defaults.
	Backoff Backoff
	// HandshakeTimeout bounds connecting, the TLS handshake and the acceptor's answer;
	// 0 means 5 s.
	HandshakeTimeout time.Duration
	// DrainTimeout bounds Close (which http.Server.Shutdown calls): the drain and the wait
	// for the proxy to close every session, after which Close closes the rest at once;
	// 0 means 30 s. Shutdown is bounded by its context instead.
	DrainTimeout time.Duration
	// ResolveInterval is how often the names of many nodes (dns:, or names in a list) are
	// resolved again: nodes that appear are joined, nodes that disappear are left (asked to
	// retire every session). 0 means 10 s. A node lost (its link ended, or it went down)
	// makes them resolve again after 1, 2, 4, ... s up to it.
	ResolveInterval time.Duration
	// NodeGrace is how long a node of many may be without its control link before it is
	// down (its share moves to the others; a hot restart of the node takes less). 0 means 5 s.
	// It is for silence and timeouts: a node whose link closed and whose address then refuses
	// connections (its process is gone) is down at once.
	NodeGrace time.Duration
	// Resolver resolves the names of many nodes; nil means net.DefaultResolver. Tests and
	// service discovery may plug in their own.
	Resolver Resolver
	// DrainedProbe is how often one registration probes while an operator holds this instance
	// drained (410 after `sluice ctl drain`), so that `sluice ctl resume` brings it back by
	// itself; 0 means 30 s.
	DrainedProbe time.Duration
	// Logger receives the instance's records (protocol/README.md "What SDKs log": one warning
	// per outage, not per slot or attempt, and one info line when it ends; one line per
	// refusal, drain hold and capacity change; debug records per session). nil sends warnings
	// and errors (refusals such as a wrong token, outages) to slog.Default() and drops the rest.
	Logger *slog.Logger

	// check, in tests, runs under the Listener's lock at every change of its state.
	check func(*Listener)
	// silence, in tests, is how long a control link may be silent before it is lost; 0 means
	// controlSilence, the protocol's three missed heartbeats.
	silence time.Duration
	// clock, in tests, is the time the nodes of many read and set their timers on; nil means
	// the real one.
	clock clock
}

// Resolver looks up the addresses of a name, as *net.Resolver does (network "ip").
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Backoff is jittered exponential backoff between failed dials: Initial doubling up to Max,
// each delay shortened by up to Jitter of itself at random, so many instances do not re-dial a
// restarted proxy in lockstep.
type Backoff struct {
	// Initial is the first delay; 0 means 100 ms.
	Initial time.Duration
	// Max is the longest delay; 0 means 5 s.
	Max time.Duration
	// Jitter is the share of each delay taken off at random, up to 1; 0 means 0.5 and a
	// negative value means no jitter.
	Jitter float64
}

// Delay is the pause before retry number attempt (0-based): Initial·2^attempt, capped at Max,
// less a random share of up to Jitter. Zero fields count as their defaults.
func (b Backoff) Delay(attempt int) time.Duration {
	b = b.withDefaults()
	attempt = max(attempt, 0)
	base := b.Max
	if attempt < 31 && b.Initial <= b.Max>>attempt {
		base = b.Initial << attempt
	}
	if b.Jitter <= 0 {
		return base
	}
	return base - time.Duration(float64(base)*b.Jitter*rand.Float64())
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = 100 * time.Millisecond
	}
	if b.Max == 0 {
		b.Max = 5 * time.Second
	}
	if b.Jitter == 0 {
		b.Jitter = 0.5
	}
	return b
}

const (
	defaultSlice            = "default"
	defaultHandshakeTimeout = 5 * time.Second
	defaultDrainTimeout     = 30 * time.Second
	defaultDrainedProbe     = 30 * time.Second
	defaultResolveInterval  = 10 * time.Second
	defaultNodeGrace        = 5 * time.Second
	unixPrefix              = "unix:"
)

// withDefaults returns a copy with every zero field replaced by its default.
func (o Options) withDefaults() Options {
	if o.Slice == "" {
		o.Slice = defaultSlice
	}
	if o.Capacity == 0 {
		o.Capacity = 1
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = defaultHandshakeTimeout
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = defaultDrainTimeout
	}
	if o.DrainedProbe == 0 {
		o.DrainedProbe = defaultDrainedProbe
	}
	if o.ResolveInterval == 0 {
		o.ResolveInterval = defaultResolveInterval
	}
	if o.NodeGrace == 0 {
		o.NodeGrace = defaultNodeGrace
	}
	if o.silence == 0 {
		o.silence = controlSilence
	}
	if o.clock == nil {
		o.clock = realClock{}
	}
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if len(o.Acceptors) > 0 && o.Acceptor == "" {
		o.Acceptor = strings.Join(o.Acceptors, ",")
	}
	o.Backoff = o.Backoff.withDefaults()
	if o.Logger == nil {
		o.Logger = slog.New(warnings{slog.Default().Handler()})
	}
	return o
}

// validate rejects options that could never register, before any dial. It expects defaults
// applied.
func (o *Options) validate() error {
	if err := o.validateIdentity(); err != nil {
		return err
	}
	a, err := o.address()
	if err != nil {
		return err
	}
	if !a.many() {
		if _, _, err := o.endpoint(); err != nil {
			return err
		}
	}
	if err := o.validateStreams(); err != nil {
		return err
	}
	switch b := o.Backoff; {
	case o.Capacity < 0:
		return invalid("Capacity must not be negative")
	case b.Initial < 0 || b.Initial > b.Max:
		return invalid("Backoff.Initial must be positive and at most Backoff.Max")
	case b.Jitter > 1:
		return invalid("Backoff.Jitter must be at most 1")
	case o.HandshakeTimeout < 0:
		return invalid("HandshakeTimeout must be positive")
	case o.DrainTimeout < 0:
		return invalid("DrainTimeout must be positive")
	case o.DrainedProbe < 0:
		return invalid("DrainedProbe must be positive")
	case o.ResolveInterval < 0:
		return invalid("ResolveInterval must be positive")
	case o.NodeGrace < 0:
		return invalid("NodeGrace must be positive")
	}
	return nil
}

// validateStreams: 0 (HTTP/1.1 sessions) or 1 to maxStreams streams per HTTP/2 session, the
// range the acceptor takes.
func (o *Options) validateStreams() error {
	if o.Streams < 0 || o.Streams > maxStreams {
		return invalid(fmt.Sprintf("Streams must be 0 (HTTP/1.1 sessions) or 1 to %d (HTTP/2 sessions)", maxStreams))
	}
	return nil
}

// validateIdentity checks the fields that become header values: a value that is not visible
// ASCII could inject a header line.
func (o *Options) validateIdentity() error {
	if o.Service == "" {
		return invalid("Service is empty")
	}
	for _, f := range []struct{ name, value string }{
		{"Service", o.Service}, {"Slice", o.Slice}, {"Instance", o.Instance}, {"Token", o.Token},
	} {
		if !headerValue(f.value) {
			return invalid(f.name + " must be visible ASCII without leading or trailing spaces")
		}
	}
	return nil
}

func headerValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c > '~' {
			return false
		}
	}
	return strings.TrimSpace(v) == v
}

// address parses Acceptor (or Acceptors, which withDefaults joined into it).
func (o *Options) address() (acceptorAddress, error) {
	if len(o.Acceptors) > 0 && o.Acceptor != strings.Join(o.Acceptors, ",") {
		return acceptorAddress{}, invalid("set Acceptor or Acceptors, not both")
	}
	for _, e := range o.Acceptors {
		if strings.Contains(e, ",") {
			return acceptorAddress{}, invalid(fmt.Sprintf("Acceptors entry %q holds a comma", e))
		}
	}
	if !strings.HasPrefix(o.Acceptor, "dns:") && !strings.Contains(o.Acceptor, ",") {
		// One acceptor, checked by endpoint as before many nodes existed (a UNIX socket, a
		// named port).
		return acceptorAddress{kind: addrSingle, entries: []string{o.Acceptor}}, nil
	}
	a, err := parseAddress(o.Acceptor)
	if err != nil {
		return acceptorAddress{}, invalid(fmt.Sprintf("Acceptor %q: %v", o.Acceptor, err))
	}
	return a, nil
}

// endpoint is the network and address to dial for a single acceptor.
func (o *Options) endpoint() (network, address string, err error) {
	if path, ok := strings.CutPrefix(o.Acceptor, unixPrefix); ok {
		if path == "" {
			return "", "", invalid("Acceptor unix: needs a path")
		}
		if o.TLS != nil && o.TLS.ServerName == "" && !o.TLS.InsecureSkipVerify {
			return "", "", invalid("TLS.ServerName must be set for a UNIX acceptor")
		}
		return "unix", path, nil
	}
	if _, _, err := net.SplitHostPort(o.Acceptor); err != nil {
		return "", "", invalid(fmt.Sprintf("Acceptor %q is neither host:port nor unix:/path", o.Acceptor))
	}
	return "tcp", o.Acceptor, nil
}

func invalid(why string) error {
	return fmt.Errorf("%w: %s", ErrInvalidOptions, why)
}

// warnings passes records of level Warn and above to h: the default Logger, so that a refusal
// is never silent while routine records stay out of the application's log.
type warnings struct{ h slog.Handler }

func (w warnings) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= slog.LevelWarn && w.h.Enabled(ctx, level)
}
func (w warnings) Handle(ctx context.Context, r slog.Record) error { return w.h.Handle(ctx, r) }
func (w warnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnings{w.h.WithAttrs(attrs)}
}
func (w warnings) WithGroup(name string) slog.Handler { return warnings{w.h.WithGroup(name)} }
