// Package sluice serves any net/http handler through Sluice by dialing in: the service opens
// connections to the proxy's acceptor and registers each as a session (docs/design.md §3), so the
// proxy never connects to the service and every session is one unit of declared concurrency.
//
// [Listen] returns a [*Listener] that keeps Options.Capacity sessions registered in the
// background and yields each registered session from Accept as a [net.Conn], so an unchanged
// [http.Server] serves through Sluice:
//
//	ln, err := sluice.Listen(context.Background(), sluice.Options{
//		Acceptor: "127.0.0.1:7070",
//		Service:  "hello",
//		Token:    os.Getenv("SLUICE_TOKEN"),
//		Capacity: 8,
//	})
//	if err != nil {
//		log.Fatal(err)
//	}
//	srv := &http.Server{Handler: ln.Handler(hello)}
//	go srv.Serve(ln)
//	// ... on SIGTERM: drain first, then stop the server.
//	ln.Shutdown(ctx)
//	srv.Shutdown(ctx) // on its own, it drains too, through ln.Close (see Options.DrainTimeout)
//
// The Listener re-dials a replacement whenever the proxy closes a session or an upgrade
// (WebSocket) consumes one, backs off with jitter while the acceptor is unreachable or busy,
// stops the slots for good on 400, 401 and 404, and while an operator holds the instance
// drained (410) probes with one registration every Options.DrainedProbe (see
// [Listener.Status]).
// [Listener.SetCapacity] resizes at runtime; wrap the handler with [Listener.Handler] so that
// shrinking retires surplus sessions at once, race-free, with `Connection: close`.
//
// # Many nodes
//
// An Acceptor of "dns:NAME:PORT" (every A and AAAA record, such as a Kubernetes headless
// Service) or a list "a:7070,b:7070" (or Options.Acceptors) names many Sluice nodes
// (protocol/README.md "Many nodes"). The Listener then dials every node, keeps a control link
// to each (the node reports its demand; the instance declares its capacity and asks for
// retirements), and splits Capacity among the nodes in proportion to where the requests are,
// never holding more than Capacity sessions in all. [Listener.Status] lists every node.
//
// # Layout
//   - options.go: [Options], [Backoff], validation and defaults.
//   - address.go: what an acceptor address names: one node, a dns: name, a list.
//   - errors.go: [Error] and [Kind]: where a dial failed and whether it is retried.
//   - wire.go: the registration, drain and control requests and the acceptor's reply, as bytes.
//   - control.go: the control link's lines (DEMAND, DRAINING, FLOOR; RETIRE, CAPACITY).
//   - split.go: the split of the capacity across nodes by demand (normative, as the vectors).
//   - dial.go: TCP/UNIX/TLS connections and the handshakes, bounded by HandshakeTimeout.
//   - conn.go: the session [net.Conn] that Accept returns.
//   - state.go: the resize bookkeeping (target, slots, owed retirements).
//   - listener.go: [Listener]: Accept, resize, status, Close, Shutdown and abort.
//   - slot.go: one goroutine per session slot: dial, register, hand over, re-dial; the
//     drained instance's probe.
//   - report.go: what an instance logs (once per outage, refusal, drain hold, capacity change).
//   - nodes.go: the nodes of many: the plan (RETIRE, SDK-side closes), the pick of a node for a
//     slot, joins and leaves, status; the clock they read (a fake one replays the fleet
//     vectors).
//   - link.go: one goroutine per node: its control link, dialed again when lost; down after
//     Options.NodeGrace, or at once when its address refuses connections once the link ended.
//   - resolve.go: re-resolving the nodes every Options.ResolveInterval.
//   - rebalance.go: one log line per rebalance, at most one a second.
//   - retire.go: [Listener.Handler], the middleware that retires sessions.
package sluice
