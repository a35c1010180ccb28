package sluice

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Many nodes against real `sluice run` processes: the split follows the requests, a killed
// node's share moves, a stopping node (DRAINING) is vacated, a node that leaves DNS is
// retired with no request lost, two instances keep one floor per node between them; the
// sessions held never exceed the capacity (sumBelow) and neither do the requests in the
// handler.

// gatedService counts its own concurrency; /wait holds a request until open is closed.
type gatedService struct {
	inFlight, most atomic.Int32
	open           chan struct{}
}

func (g *gatedService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	for m := g.most.Load(); now > m && !g.most.CompareAndSwap(m, now); m = g.most.Load() {
	}
	if r.URL.Path == "/wait" {
		<-g.open
	}
	io.WriteString(w, "hello\n")
}

// getAll sends n GETs to a node's listener at once; each result lands on the channel.
func getAll(t *testing.T, addr, path string, n int) <-chan error {
	results := make(chan error, n)
	client := &http.Client{Timeout: testDeadline, Transport: &http.Transport{MaxConnsPerHost: n, MaxIdleConnsPerHost: n}}
	for range n {
		go func() {
			resp, err := client.Get("http://" + addr + path)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(body) != "hello\n" {
					err = fmt.Errorf("GET %s: %d %q", path, resp.StatusCode, body)
				}
			}
			results <- err
		}()
	}
	return results
}

func noFailure(t *testing.T, results <-chan error, n int) {
	t.Helper()
	for range n {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
}

// liveHeld waits until the instance holds want[i] sessions at nodes[i], registered.
func liveHeld(t *testing.T, ln *Listener, nodes []*sluiceNode, want ...int) {
	t.Helper()
	waitUntil(t, ln, fmt.Sprintf("held %v", want), func(l *Listener) bool {
		for i, s := range nodes {
			n := l.nodeAt(s.Acceptor)
			if n == nil || len(n.members) != want[i] || n.sessions != want[i] || n.retiring+n.evicting != 0 {
				return false
			}
		}
		return true
	})
}

func TestRealProxiesSplitByDemandMoveOnDeathAndDrain(t *testing.T) {
	t.Parallel()
	nodes := []*sluiceNode{
		startSluice(t, sluiceConfig("127.0.0.1", 0)),
		startSluice(t, sluiceConfig("127.0.0.1", 0)),
		startSluice(t, sluiceConfig("127.0.0.1", 0)),
	}
	g := &gatedService{open: make(chan struct{})}
	var logs logLines
	// A grace longer than the test may last: a killed node is down because it refuses
	// connections, a stopped one has said DRAINING.
	ln := listenMany(t, Options{
		Acceptors: []string{nodes[0].Acceptor, nodes[1].Acceptor, nodes[2].Acceptor},
		Instance:  "go-multi", Token: sluiceToken, Capacity: 6,
		NodeGrace: time.Hour, Logger: logs.logger(),
	})
	serve(t, ln, g.ServeHTTP)
	liveHeld(t, ln, nodes, 2, 2, 2)

	// Eight requests at the first node: two in flight, six queued. Its demand pulls sessions
	// from the others (RETIRE, idle ones close at once) until it holds 4 of 6.
	waiting := getAll(t, nodes[0].HTTP, "/wait", 8)
	liveHeld(t, ln, nodes, 4, 1, 1)
	waitUntil(t, ln, "four requests in the handler", func(*Listener) bool { return g.inFlight.Load() == 4 })
	close(g.open)
	noFailure(t, waiting, 8)

	// A crash: its link closes and its acceptor refuses connections, so the third node is
	// down at once (it takes milliseconds; a second is generous) and its share moves.
	nodes[2].kill()
	waitWithin(t, ln, time.Second, "the third node is down", func(l *Listener) bool {
		st, _ := nodeOf(l, nodes[2].Acceptor)
		return st.State == "down"
	})
	waitUntil(t, ln, "the third node's share moved", func(l *Listener) bool {
		return held(l, nodes[0].Acceptor)+held(l, nodes[1].Acceptor) == 6
	})
	noFailure(t, getAll(t, nodes[1].HTTP, "/", 4), 4)

	// A graceful stop: the node says DRAINING and the instance moves everything off it.
	stopped := make(chan struct{})
	go func() { nodes[1].stop(); close(stopped) }()
	waitUntil(t, ln, "the second node is left", func(l *Listener) bool {
		st, _ := nodeOf(l, nodes[1].Acceptor)
		return (st.State == "draining" || st.State == "down") && held(l, nodes[0].Acceptor) == 6
	})
	<-stopped
	// Stopped, it refuses connections: expected of a node that said DRAINING, so it is no
	// "node down" warning. (A session dial may still meet the closed acceptor before the
	// DRAINING line arrives on the link: that is an outage as far as the SDK knew.)
	logs.wait(t, "level=INFO", "the draining node is gone", "node="+nodes[1].Acceptor)
	if n := logs.count("level=WARN", "node down", "node="+nodes[1].Acceptor); n != 0 {
		t.Errorf("%d warnings that the node that stopped gracefully is down:\n%s", n, &logs)
	}
	noFailure(t, getAll(t, nodes[0].HTTP, "/", 12), 12)
	if m := g.most.Load(); m > 6 {
		t.Errorf("%d requests in the handler at once, above the capacity of 6", m)
	}
	if n := logs.count("level=INFO", "rebalance"); n == 0 {
		t.Errorf("no rebalance line:\n%s", &logs)
	}
}

// freePort finds a port free on every one of ips (for dns: names, whose nodes share a port).
func freePort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 20 {
		first, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := first.Addr().(*net.TCPAddr).Port
		held := []net.Listener{first}
		for _, ip := range ips[1:] {
			if l, err := net.Listen("tcp", ip+":"+strconv.Itoa(port)); err == nil {
				held = append(held, l)
			}
		}
		for _, l := range held {
			l.Close()
		}
		if len(held) == len(ips) {
			return port
		}
	}
	t.Fatal("no port free on every address")
	return 0
}

// A node removed from the name: it is asked to retire every session, the requests in flight
// there finish, and its link closes once it holds none; nothing fails.
func TestRealProxyRemovedFromDNSIsRetiredWithoutAFailedRequest(t *testing.T) {
	t.Parallel()
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	port := freePort(t, ips...)
	var nodes []*sluiceNode
	for _, ip := range ips {
		nodes = append(nodes, startSluice(t, sluiceConfig(ip, port)))
	}
	r := &fakeResolver{}
	r.set(ips...)
	g := &gatedService{open: make(chan struct{})}
	ln := listenMany(t, Options{
		Acceptor: "dns:nodes.test:" + strconv.Itoa(port), Resolver: r, ResolveInterval: 50 * time.Millisecond,
		Instance: "go-dns", Token: sluiceToken, Capacity: 6,
	})
	serve(t, ln, g.ServeHTTP)
	liveHeld(t, ln, nodes, 2, 2, 2)
	inFlight := getAll(t, nodes[2].HTTP, "/wait", 2)
	waitUntil(t, ln, "two requests in the handler", func(*Listener) bool { return g.inFlight.Load() == 2 })

	r.set(ips[:2]...)
	waitUntil(t, ln, "the third node's sessions are retiring", func(l *Listener) bool {
		n := l.nodeAt(nodes[2].Acceptor)
		return n != nil && n.gone && n.holding() == 0
	})
	close(g.open)
	noFailure(t, inFlight, 2)
	waitUntil(t, ln, "the third node is forgotten", func(l *Listener) bool { return l.nodeAt(nodes[2].Acceptor) == nil })
	liveHeld(t, ln, nodes[:2], 3, 3)
	if m := g.most.Load(); m > 6 {
		t.Errorf("%d requests in the handler at once, above the capacity", m)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := ln.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// Two instances of one service (6 + 4 sessions) on three real nodes: each node asks the
// larger for its floor (FLOOR 1) and the smaller for none (FLOOR 0), so when the requests are
// all at the first node, the smaller instance moves all of its sessions there and the idle
// nodes keep one session each of the service, not one of each instance.
func TestRealProxiesKeepOneFloorPerServiceNotPerInstance(t *testing.T) {
	t.Parallel()
	nodes := []*sluiceNode{
		startSluice(t, sluiceConfig("127.0.0.1", 0)),
		startSluice(t, sluiceConfig("127.0.0.1", 0)),
		startSluice(t, sluiceConfig("127.0.0.1", 0)),
	}
	acceptors := []string{nodes[0].Acceptor, nodes[1].Acceptor, nodes[2].Acceptor}
	g := &gatedService{open: make(chan struct{})}
	large := listenMany(t, Options{Acceptors: acceptors, Instance: "go-floor-6", Token: sluiceToken, Capacity: 6})
	serve(t, large, g.ServeHTTP)
	liveHeld(t, large, nodes, 2, 2, 2)
	small := listenMany(t, Options{Acceptors: acceptors, Instance: "go-floor-4", Token: sluiceToken, Capacity: 4})
	serve(t, small, g.ServeHTTP)
	waitUntil(t, small, "every node asks the smaller instance for no floor", func(l *Listener) bool {
		for _, n := range l.nodes {
			if !n.noFloor || !n.sampled {
				return false
			}
		}
		return len(l.nodes) == 3
	})

	// Ten requests at the first node: eight in flight on its sessions, two queued.
	waiting := getAll(t, nodes[0].HTTP, "/wait", 10)
	liveHeld(t, large, nodes, 4, 1, 1)
	liveHeld(t, small, nodes, 4, 0, 0)
	waitUntil(t, small, "eight requests in the handler", func(*Listener) bool { return g.inFlight.Load() == 8 })
	close(g.open)
	noFailure(t, waiting, 10)
	if m := g.most.Load(); m > 10 {
		t.Errorf("%d requests in the handlers at once, above the capacities", m)
	}
}

// A hot restart (`sluice run --upgrade`) passes the listening sockets and idle sessions to a
// new process, and the old one exits: the control link closes and is dialed again, and the
// connect reaches the new process through the socket it was passed, never refused. The node
// stays live, no session moves or is dialed again, and nothing says it is down.
func TestRealProxyHotRestartKeepsTheNodeAndItsSessions(t *testing.T) {
	t.Parallel()
	upgrade := `[runtime]` + "\n" + fmt.Sprintf("upgrade_socket = %q", filepath.Join(t.TempDir(), "upgrade.sock"))
	config := sluiceConfig("127.0.0.1", 0, upgrade)
	old := startSluice(t, config)
	var logs logLines
	ln := listenMany(t, Options{
		// Listed twice: a list (so a control link), and one node.
		Acceptors: []string{old.Acceptor, old.Acceptor}, Instance: "go-hot", Token: sluiceToken,
		Capacity: 2, NodeGrace: time.Hour, Logger: logs.logger(),
	})
	serve(t, ln, hello)
	liveHeld(t, ln, []*sluiceNode{old}, 2)

	next := startSluice(t, config, "--upgrade")
	if next.Acceptor != old.Acceptor {
		t.Fatalf("the new process listens at %s, not at %s", next.Acceptor, old.Acceptor)
	}
	old.waitExit()
	logs.wait(t, "control link ended", "node="+old.Acceptor)
	waitUntil(t, ln, "the link is up at the new process", func(l *Listener) bool {
		st, _ := nodeOf(l, old.Acceptor)
		return st.Live && st.State == ""
	})
	noFailure(t, getAll(t, next.HTTP, "/", 4), 4)
	liveHeld(t, ln, []*sluiceNode{old}, 2)
	if n := logs.count("session ended") + logs.count("node down"); n != 0 {
		t.Errorf("the hot restart moved sessions or took the node down:\n%s", &logs)
	}
}

// examples/multinode, as the cross-language test drives it: a list of two real nodes,
// requests through both, /max through Sluice at most the capacity, SIGTERM drains.
func TestRealProxiesServeTheMultinodeExample(t *testing.T) {
	t.Parallel()
	// The nodes hold requests until the sessions register: no need to wait for them.
	a := startSluice(t, sluiceConfig("127.0.0.1", 0, `no_sessions_wait = "20s"`))
	b := startSluice(t, sluiceConfig("127.0.0.1", 0, `no_sessions_wait = "20s"`))
	bin := filepath.Join(t.TempDir(), "multinode")
	if out, err := exec.Command("go", "build", "-o", bin, "./examples/multinode").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-capacity", "3", "-delay", "20ms")
	cmd.Env = append(os.Environ(), "SLUICE_ACCEPTOR="+a.Acceptor+","+b.Acceptor, "SLUICE_SERVICE=api",
		"SLUICE_INSTANCE=example", "SLUICE_TOKEN="+sluiceToken)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	first, second := getAll(t, a.HTTP, "/", 10), getAll(t, b.HTTP, "/", 10)
	noFailure(t, first, 10)
	noFailure(t, second, 10)
	resp, err := http.Get("http://" + a.HTTP + "/max")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if most, err := strconv.Atoi(strings.TrimSpace(string(body))); err != nil || most < 1 || most > 3 {
		t.Errorf("/max answered %q, want 1 to 3", body)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the example exited with %v", err)
	}
	if !strings.HasPrefix(stdout.String(), "max_in_flight ") {
		t.Errorf("stdout %q", stdout.String())
	}
}
