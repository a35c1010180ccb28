package sluice

import (
	"errors"
	"strconv"
	"strings"
)

// addressKind says how many nodes an acceptor address names (protocol/README.md "The acceptor
// address").
type addressKind int

const (
	// addrSingle: one node, `host:port`, resolved on each dial; no control link.
	addrSingle addressKind = iota + 1
	// addrDNS: `dns:NAME:PORT`, every A and AAAA record of NAME, re-resolved periodically.
	addrDNS
	// addrList: `a:port,b:port,…`, each entry and each address an entry's name resolves to.
	addrList
)

// acceptorAddress is a parsed acceptor address.
type acceptorAddress struct {
	kind addressKind
	// entries are the host:port entries: the one of a single address, the list's, or
	// NAME:PORT of a dns: address.
	entries []string
}

// many reports whether the address names several nodes (and so control links are used).
func (a acceptorAddress) many() bool { return a.kind != addrSingle }

// parseAddress reads an acceptor address as crates/sluice-session/src/address.rs does.
func parseAddress(text string) (acceptorAddress, error) {
	if rest, ok := strings.CutPrefix(text, "dns:"); ok {
		i := strings.LastIndexByte(rest, ':')
		if i < 0 {
			return acceptorAddress{}, errors.New("dns: needs NAME:PORT")
		}
		name, port := rest[:i], rest[i+1:]
		if name == "" || strings.ContainsAny(name, ", ") {
			return acceptorAddress{}, errors.New("dns: needs a name")
		}
		if !validPort(port) {
			return acceptorAddress{}, errors.New("the port must be 1 to 65535")
		}
		return acceptorAddress{kind: addrDNS, entries: []string{rest}}, nil
	}
	entries := strings.Split(text, ",")
	for i, e := range entries {
		entries[i] = strings.TrimSpace(e)
		if err := checkHostPort(entries[i]); err != nil {
			return acceptorAddress{}, err
		}
	}
	if len(entries) == 1 {
		return acceptorAddress{kind: addrSingle, entries: entries}, nil
	}
	return acceptorAddress{kind: addrList, entries: entries}, nil
}

// checkHostPort accepts one `host:port` entry: a non-empty host (a bracketed IPv6 address, or
// a name or IPv4 address without spaces) and a port of 1 to 65535.
func checkHostPort(entry string) error {
	if entry == "" {
		return errors.New("an empty entry")
	}
	if strings.HasPrefix(entry, "dns:") {
		return errors.New("dns: is a whole address, not a list entry")
	}
	i := strings.LastIndexByte(entry, ':')
	if i < 0 {
		return errors.New("each entry needs host:port")
	}
	host, port := entry[:i], entry[i+1:]
	bracketed := strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]")
	if host == "" || strings.ContainsAny(host, " /") || (strings.Contains(host, ":") && !bracketed) {
		return errors.New("each entry needs host:port")
	}
	if !validPort(port) {
		return errors.New("the port must be 1 to 65535")
	}
	return nil
}

func validPort(text string) bool {
	if text == "" || strings.TrimLeft(text, "0123456789") != "" {
		return false
	}
	port, err := strconv.ParseUint(text, 10, 16)
	return err == nil && port != 0
}
