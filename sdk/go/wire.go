package sluice

import (
	"bytes"
	"errors"
	"net/netip"
	"strconv"
	"strings"
)

const (
	sessionPath  = "/.sluice/v1/session"
	drainPath    = "/.sluice/v1/drain"
	controlPath  = "/.sluice/v1/control"
	upgradeToken = "sluice-session/1"
	// controlToken is the control link's protocol (many nodes).
	controlToken = "sluice-control/1"
	// maxReplyHead bounds the acceptor's answer head, as the acceptor bounds ours.
	maxReplyHead = 8 << 10
	// noCapacity leaves Sluice-Capacity out of a registration.
	noCapacity = -1
	// protocolHeader names an HTTP/2 session's protocol in its registration and in the 101;
	// streamsHeader is how many streams such a session takes at once.
	protocolHeader = "Sluice-Protocol"
	streamsHeader  = "Sluice-Streams"
	protocolH2     = "h2"
	protocolHTTP1  = "http/1.1"
	// splitHeader tells a node how the SDK splits (protocol/README.md "The floor is per
	// service, not per instance"); splitByService asks the node for FLOOR lines.
	splitHeader    = "Sluice-Split"
	splitByService = "service"
	// maxStreams bounds Sluice-Streams, as the acceptor does.
	maxStreams = 1000
	// clientAddrHeader carries the client's address as the proxy saw it (its TCP peer) on
	// every request over a session; the proxy replaces any copy a client sent.
	clientAddrHeader = "Sluice-Client-Addr"
)

// parseClientAddr is the client address that exactly one Sluice-Client-Addr field names:
// "ip:port" or "[ipv6]:port", nothing around it, no zone. A value is trusted whole or not at
// all: ok is false for anything else, and for several fields.
func parseClientAddr(values []string) (addr netip.AddrPort, ok bool) {
	if len(values) != 1 {
		return netip.AddrPort{}, false
	}
	addr, err := netip.ParseAddrPort(values[0])
	if err != nil || addr.Addr().Zone() != "" {
		return netip.AddrPort{}, false
	}
	return addr, true
}

// identity is who speaks in a handshake; "" instance or token means absent.
type identity struct {
	service, slice, instance, token string
}

func (o *Options) identity() identity {
	return identity{o.Service, o.Slice, o.Instance, o.Token}
}

// encodeRegistration is `GET /.sluice/v1/session` with Upgrade; capacity noCapacity omits
// Sluice-Capacity; streams above 0 asks for an HTTP/2 session of that many streams
// (Sluice-Protocol: h2, Sluice-Streams). Header order is fixed by the protocol vectors.
func encodeRegistration(id identity, capacity, streams int) []byte {
	b := encodeUpgrade(sessionPath, upgradeToken, id, capacity)
	if streams <= 0 {
		return b
	}
	b = b[:len(b)-2] // before the blank line
	b = append(b, protocolHeader+": "+protocolH2+"\r\n"+streamsHeader+": "+strconv.Itoa(streams)+"\r\n\r\n"...)
	return b
}

// encodeControl is the control link's request, `GET /.sluice/v1/control` with Upgrade
// sluice-control/1, the identity, the declared capacity and, unless split is "",
// Sluice-Split (this SDK always sends splitByService; the vectors also pin links without it).
func encodeControl(id identity, capacity int, split string) []byte {
	b := encodeUpgrade(controlPath, controlToken, id, capacity)
	if split == "" {
		return b
	}
	b = b[:len(b)-2] // before the blank line
	return append(b, splitHeader+": "+split+"\r\n\r\n"...)
}

func encodeUpgrade(path, token string, id identity, capacity int) []byte {
	var b bytes.Buffer
	b.WriteString("GET " + path + " HTTP/1.1\r\nHost: sluice\r\nConnection: Upgrade\r\nUpgrade: " + token + "\r\n")
	writeIdentity(&b, id)
	if capacity != noCapacity {
		b.WriteString("Sluice-Capacity: " + strconv.Itoa(capacity) + "\r\n")
	}
	b.WriteString("\r\n")
	return b.Bytes()
}

// encodeDrain is `POST /.sluice/v1/drain` for the instance.
func encodeDrain(id identity) []byte {
	var b bytes.Buffer
	b.WriteString("POST " + drainPath + " HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\n")
	writeIdentity(&b, id)
	b.WriteString("\r\n")
	return b.Bytes()
}

func writeIdentity(b *bytes.Buffer, id identity) {
	b.WriteString("Sluice-Service: " + id.service + "\r\nSluice-Slice: " + id.slice + "\r\n")
	if id.instance != "" {
		b.WriteString("Sluice-Instance: " + id.instance + "\r\n")
	}
	if id.token != "" {
		b.WriteString("Authorization: Bearer " + id.token + "\r\n")
	}
}

// replyKind is what the acceptor answered.
type replyKind int

const (
	// replySwitched: 101 with Upgrade: sluice-session/1; the connection is a session.
	replySwitched replyKind = iota + 1
	// replyDrained: 200; a drain was accepted.
	replyDrained
	// replyRefused: any other status.
	replyRefused
)

type reply struct {
	kind   replyKind
	status int
	// h2: a session's 101 named Sluice-Protocol: h2 (the session speaks HTTP/2).
	h2 bool
}

// errPartial: the head is not complete yet; read more.
var errPartial = errors.New("partial reply head")

// parseReply parses the head of the acceptor's answer in buf and returns it with the head's
// length. A 101 must name protocol (upgradeToken or controlToken) in Upgrade; anything that is
// not an HTTP/1.x status head is a protocol error.
func parseReply(buf []byte, protocol string) (reply, int, error) {
	end := headEnd(buf)
	if end < 0 {
		if len(buf) >= maxReplyHead {
			return reply{}, 0, errors.New("reply head larger than 8 KiB")
		}
		return reply{}, 0, errPartial
	}
	lines := strings.Split(strings.TrimRight(string(buf[:end]), "\r\n"), "\n")
	status, err := parseStatusLine(strings.TrimSuffix(lines[0], "\r"))
	if err != nil {
		return reply{}, 0, err
	}
	upgrade, err := findHeader(lines[1:], "Upgrade")
	if err != nil {
		return reply{}, 0, err
	}
	switch status {
	case 101:
		if !strings.EqualFold(upgrade, protocol) {
			return reply{}, 0, errors.New("101 without Upgrade: " + protocol)
		}
		// A session's 101 names its protocol: absent, empty or http/1.1 for HTTP/1.1.
		named, _ := findHeader(lines[1:], protocolHeader)
		switch {
		case protocol != upgradeToken || named == "" || strings.EqualFold(named, protocolHTTP1):
			return reply{kind: replySwitched, status: status}, end, nil
		case strings.EqualFold(named, protocolH2):
			return reply{kind: replySwitched, status: status, h2: true}, end, nil
		}
		return reply{}, 0, errors.New("101 naming an unknown Sluice-Protocol")
	case 200:
		return reply{kind: replyDrained, status: status}, end, nil
	}
	return reply{kind: replyRefused, status: status}, end, nil
}

// headEnd is the length of the head including its blank line, or -1.
func headEnd(buf []byte) int {
	crlf, lf := bytes.Index(buf, []byte("\r\n\r\n")), bytes.Index(buf, []byte("\n\n"))
	switch {
	case crlf >= 0 && (lf < 0 || crlf < lf):
		return crlf + 4
	case lf >= 0:
		return lf + 2
	}
	return -1
}

// parseStatusLine reads "HTTP/1.x NNN reason".
func parseStatusLine(line string) (int, error) {
	rest, ok := strings.CutPrefix(line, "HTTP/1.")
	if !ok || len(rest) < 5 || (rest[0] != '0' && rest[0] != '1') || rest[1] != ' ' {
		return 0, errors.New("malformed acceptor reply")
	}
	code := rest[2:5]
	status, err := strconv.Atoi(code)
	if err != nil || code[0] < '1' || code[0] > '9' || (len(rest) > 5 && rest[5] != ' ') {
		return 0, errors.New("malformed acceptor reply")
	}
	return status, nil
}

// findHeader returns the trimmed value of the named header ("" when absent) and rejects lines
// that are not headers.
func findHeader(lines []string, name string) (string, error) {
	var value string
	for _, line := range lines {
		k, v, ok := strings.Cut(strings.TrimSuffix(line, "\r"), ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return "", errors.New("malformed acceptor reply")
		}
		if strings.EqualFold(k, name) && value == "" {
			value = strings.TrimSpace(v)
		}
	}
	return value, nil
}
