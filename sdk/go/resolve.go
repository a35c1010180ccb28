package sluice

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// resolveSoon is how long after a node is lost its name is resolved again: the first of the
// follow-ups that double up to ResolveInterval (protocol/README.md, "The acceptor address").
const resolveSoon = time.Second

// suspectLocked: a node was lost (its link ended, or it went down), a change of the name
// suspected: the resolver looks again soon. l.mu must be held.
func (l *Listener) suspectLocked() {
	select {
	case l.resolveSoon <- struct{}{}:
	default:
	}
}

// runResolver resolves the address of many nodes every ResolveInterval (sooner, with backoff,
// while it fails) and joins and leaves nodes accordingly. A failed resolution, "no such host"
// included, keeps the nodes known: a node leaves only when an answer no longer lists it. A
// node lost makes it resolve again resolveSoon later, then after twice as long each time until
// the pause reaches ResolveInterval, so that a node back under a new address (a restarted
// pod) is found within seconds. It returns when the Listener closes.
func (l *Listener) runResolver() {
	failures := 0
	var follow time.Duration
	for l.dialCtx.Err() == nil {
		all, err := l.resolve(l.dialCtx)
		if l.dialCtx.Err() != nil {
			return
		}
		wait := l.opts.ResolveInterval
		l.mu.Lock()
		if err != nil {
			if failures == 0 {
				l.log.Warn("cannot resolve the acceptor's nodes; keeping those known (logged once until it resolves)", "error", err)
			}
			l.lastErr = err
			wait = min(l.opts.Backoff.Delay(failures), wait)
			failures++
			l.notifyLocked()
		} else {
			if failures > 0 {
				l.log.Info("the acceptor's nodes resolve again", "failed", failures)
			}
			failures = 0
			l.setNodesLocked(all)
		}
		l.mu.Unlock()
		if follow > 0 {
			wait = min(wait, follow)
			if follow *= 2; follow >= l.opts.ResolveInterval {
				follow = 0
			}
		}
		if l.waitSuspected(wait) {
			follow = 2 * resolveSoon
			sleepCtx(l.dialCtx, min(resolveSoon, l.opts.ResolveInterval))
		}
	}
}

// waitSuspected waits d, or until a node is lost (true), or the Listener closes.
func (l *Listener) waitSuspected(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-l.dialCtx.Done():
	case <-l.resolveSoon:
		return true
	}
	return false
}

// resolve lists the nodes the address names now: each entry's addresses, sorted, in the
// entries' order.
func (l *Listener) resolve(ctx context.Context) ([]found, error) {
	ctx, cancel := context.WithTimeout(ctx, l.opts.HandshakeTimeout)
	defer cancel()
	var all []found
	for _, entry := range l.address.entries {
		i := strings.LastIndexByte(entry, ':')
		host := strings.Trim(entry[:i], "[]")
		port, _ := strconv.ParseUint(entry[i+1:], 10, 16) // checked by parseAddress
		ips, err := l.lookup(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
		for _, ip := range ips {
			all = append(all, found{netip.AddrPortFrom(ip.Unmap(), uint16(port)), host})
		}
	}
	return all, nil
}

// lookup is an IP address as it is, or every address of a name, sorted.
func (l *Listener) lookup(ctx context.Context, host string) ([]netip.Addr, error) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip}, nil
	}
	ips, err := l.opts.Resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, errors.New("no addresses")
	}
	ips = slices.Clone(ips)
	slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
	return ips, nil
}
