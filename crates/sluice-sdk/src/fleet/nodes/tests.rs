#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_session::control::{Demand, ServiceLine};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::Instant;

use super::{Dialed, Nodes, Pick, Timing};

const PROBE: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(5);
const FIRST_WAIT: Duration = Duration::from_secs(5);
const TIMING: Timing = Timing {
    probe_every: PROBE,
    node_grace: GRACE,
    first_wait: FIRST_WAIT,
    backoff: crate::options::Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(5),
        jitter: 0.5,
    },
};

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8], 7070))
}

fn demand(in_flight: u64, queued: u64) -> Demand {
    Demand {
        in_flight,
        queued,
        refused: 0,
        sessions: 0,
    }
}

/// `n` listed nodes, each with a link up that said `DEMAND 0 0 0 0`; their link receivers.
fn fleet(n: usize, capacity: usize) -> (Nodes, Vec<UnboundedReceiver<ServiceLine>>, Instant) {
    let now = Instant::now();
    let mut nodes = Nodes::new(TIMING);
    nodes.set_capacity(capacity, now);
    let all: Vec<SocketAddr> = (0..n).map(addr).collect();
    nodes.update(&all, now);
    let mut links = Vec::new();
    for &a in &all {
        let (tx, rx) = unbounded_channel();
        nodes.connected(a, tx);
        nodes.demand(a, demand(0, 0), now);
        links.push(rx);
    }
    (nodes, links, now)
}

/// Dials and registers sessions until no slot may dial; returns where each went.
fn fill(nodes: &mut Nodes, now: Instant) -> Vec<SocketAddr> {
    let mut at = Vec::new();
    while let Pick::Dial { addr, probe } = nodes.pick(now) {
        nodes.dialed(addr, probe, Dialed::Registered, now);
        at.push(addr);
    }
    at
}

fn lines(rx: &mut UnboundedReceiver<ServiceLine>) -> Vec<ServiceLine> {
    let mut out = Vec::new();
    while let Ok(line) = rx.try_recv() {
        out.push(line);
    }
    out
}

fn targets(nodes: &Nodes) -> Vec<usize> {
    nodes.status().iter().map(|s| s.target).collect()
}

fn held(nodes: &Nodes) -> Vec<usize> {
    nodes.status().iter().map(|s| s.held).collect()
}

#[test]
fn the_split_vectors_give_the_same_targets_through_the_books() {
    let v = sluice_session::vectors::load().unwrap();
    assert!(v.splits.len() >= 10);
    let now = Instant::now();
    for case in &v.splits {
        let mut nodes = Nodes::new(TIMING);
        let all: Vec<SocketAddr> = (0..case.nodes.len()).map(addr).collect();
        nodes.update(&all, now);
        for (node, want) in nodes.nodes.iter_mut().zip(&case.nodes) {
            node.live_link = want.live;
            node.demand = Some(want.demand);
            node.registered = want.held;
            node.floor = want.floor;
            node.asking = !case.quiet;
        }
        nodes.capacity = case.capacity;
        nodes.plan(now);
        assert_eq!(targets(&nodes), case.targets, "{}", case.name);
    }
}

/// `n` listed nodes of a first resolution, none of which has answered its link yet.
fn first_resolution(n: usize, capacity: usize) -> (Nodes, Instant) {
    let now = Instant::now();
    let mut nodes = Nodes::new(TIMING);
    nodes.set_capacity(capacity, now);
    nodes.update(&(0..n).map(addr).collect::<Vec<_>>(), now);
    (nodes, now)
}

/// Node `i`'s link comes up and says `DEMAND 0 0 0 0`.
fn answer(nodes: &mut Nodes, i: usize, now: Instant) -> UnboundedReceiver<ServiceLine> {
    let (tx, rx) = unbounded_channel();
    nodes.connected(addr(i), tx);
    nodes.demand(addr(i), demand(0, 0), now);
    rx
}

#[test]
fn the_first_dials_wait_until_every_node_of_the_first_resolution_answered() {
    let (mut nodes, now) = first_resolution(3, 6);
    let _a = answer(&mut nodes, 0, now);
    assert_eq!(nodes.pick(now), Pick::Wait(Some(now + FIRST_WAIT)));
    let _b = answer(&mut nodes, 1, now);
    assert_eq!(nodes.pick(now), Pick::Wait(Some(now + FIRST_WAIT)));
    let _c = answer(&mut nodes, 2, now);
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [2, 2, 2]);
}

#[test]
fn a_node_whose_first_link_fails_holds_nothing_back() {
    let (mut nodes, now) = first_resolution(3, 6);
    let _a = answer(&mut nodes, 0, now);
    nodes.link_lost(addr(2), now);
    nodes.refused(addr(2), now);
    assert_eq!(nodes.pick(now), Pick::Wait(Some(now + FIRST_WAIT)));
    let _b = answer(&mut nodes, 1, now);
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [3, 3, 0]);
}

#[test]
fn a_node_that_never_answers_holds_the_first_dials_back_for_the_first_wait_only() {
    let (mut nodes, now) = first_resolution(3, 6);
    let _a = answer(&mut nodes, 0, now);
    let _b = answer(&mut nodes, 1, now);
    let later = now + FIRST_WAIT;
    assert!(matches!(nodes.pick(later - FIRST_WAIT / 10), Pick::Wait(_)));
    fill(&mut nodes, later);
    assert_eq!(held(&nodes), [3, 3, 0]);
}

#[test]
fn nodes_that_join_after_the_first_answer_hold_nothing_back() {
    let (mut nodes, _links, now) = fleet(2, 6);
    nodes.update(&[addr(0), addr(1), addr(2)], now);
    assert!(matches!(nodes.pick(now), Pick::Dial { .. }));
}

#[test]
fn slots_fill_the_targets_and_never_more_than_the_capacity() {
    let (mut nodes, mut links, now) = fleet(3, 7);
    assert_eq!(fill(&mut nodes, now).len(), 7);
    assert_eq!(held(&nodes).iter().sum::<usize>(), 7);
    assert_eq!(nodes.pick(now), Pick::Wait(None));
    for link in &mut links {
        assert_eq!(lines(link), [ServiceLine::Capacity(7)]);
    }
}

#[test]
fn demand_moves_sessions_by_retire_at_the_surplus_node() {
    let (mut nodes, mut links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [2, 2]);
    lines(&mut links[0]);
    // Node 1 queues: it should hold more, and node 0 is asked to give up what it holds
    // beyond its share; the SDK does not close node 0's sessions itself.
    nodes.demand(addr(1), demand(2, 10), now);
    let retire = lines(&mut links[0]);
    assert_eq!(retire, [ServiceLine::Retire(1)]);
    assert!(!nodes.claim_close(addr(0)));
    assert_eq!(nodes.pick(now), Pick::Wait(None), "the sum would exceed 4");
    // The node closes one; its slot goes to node 1 at once.
    assert!(
        nodes.ended(addr(0)),
        "a retired session is moved, not failed"
    );
    assert_eq!(
        nodes.pick(now),
        Pick::Dial {
            addr: addr(1),
            probe: false
        }
    );
}

#[test]
fn a_move_for_demand_holds_the_next_for_a_second_but_not_a_node_down() {
    let (mut nodes, mut links, now) = fleet(3, 9);
    fill(&mut nodes, now);
    lines(&mut links[0]);
    lines(&mut links[1]);
    // Node 0 queues: the others give it sessions, by RETIRE.
    nodes.demand(addr(0), demand(8, 0), now);
    assert_eq!(targets(&nodes), [7, 1, 1]);
    assert_eq!(lines(&mut links[1]), [ServiceLine::Retire(2)]);
    for i in [1, 1, 2, 2] {
        assert!(nodes.ended(addr(i)));
    }
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [7, 1, 1]);
    // Then the demand moves to node 1 at once: within the second, step 5 waits.
    let soon = now + Duration::from_millis(999);
    nodes.demand(addr(1), demand(80, 0), soon);
    assert_eq!(targets(&nodes), [7, 1, 1]);
    assert!(lines(&mut links[0]).is_empty());
    // Steps 1-4 do not: node 2 goes down, and its session's slot dials node 1 at once.
    nodes.draining(addr(2), soon);
    assert_eq!(targets(&nodes), [7, 2, 0]);
    // A second after the move, the next DEMAND moves again.
    nodes.demand(addr(1), demand(80, 0), now + Duration::from_secs(1));
    assert_eq!(targets(&nodes)[0], 1);
    assert_eq!(lines(&mut links[0]), [ServiceLine::Retire(6)]);
}

#[test]
fn a_floor_counts_only_where_the_node_asks_for_it_and_a_new_link_asks_again() {
    let (mut nodes, now) = first_resolution(2, 4);
    let (tx, mut busy) = unbounded_channel();
    nodes.connected(addr(0), tx);
    nodes.demand(addr(0), demand(4, 0), now);
    // Node 1 counts on another instance for its floor, and has no demand: nothing here.
    let (tx, _idle) = unbounded_channel();
    nodes.connected(addr(1), tx);
    nodes.floor(addr(1), false);
    nodes.demand(addr(1), demand(0, 0), now);
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [4, 0]);
    assert!(!nodes.status()[1].floor);
    lines(&mut busy);
    // Its new link asks for the floor until it says otherwise (an older node never does).
    nodes.link_lost(addr(1), now);
    let (tx, _idle) = unbounded_channel();
    nodes.connected(addr(1), tx);
    nodes.demand(addr(1), demand(0, 0), now);
    assert!(nodes.status()[1].floor);
    assert_eq!(targets(&nodes), [3, 1]);
    assert_eq!(lines(&mut busy), [ServiceLine::Retire(1)]);
    // FLOOR plans nothing by itself: the next DEMAND does.
    let later = now + Duration::from_secs(1);
    nodes.floor(addr(1), false);
    assert_eq!(targets(&nodes), [3, 1]);
    nodes.demand(addr(1), demand(0, 0), later);
    assert_eq!(targets(&nodes), [4, 0]);
}

/// Issue 46: the SDK closes nothing at a node that said `DRAINING` (its sessions answer the
/// requests the node queued); each one the node closes moves, and once the node is down the
/// SDK closes what is left there.
#[test]
fn a_draining_node_closes_its_sessions_itself_and_each_one_moves() {
    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    nodes.draining(addr(0), now);
    assert_eq!(targets(&nodes), [0, 4]);
    assert!(
        !nodes.claim_close(addr(0)),
        "the SDK closed a session at a draining node"
    );
    assert!(
        matches!(nodes.pick(now), Pick::Wait(_)),
        "a dial beyond the capacity"
    );
    assert!(nodes.ended(addr(0)), "one the node closed moves");
    assert!(matches!(nodes.pick(now), Pick::Dial { addr: a, .. } if a == addr(1)));
    assert!(
        !nodes.link_lost(addr(0), now),
        "a draining node's going is no outage"
    );
    nodes.refused(addr(0), now);
    assert_eq!(nodes.status()[0].link, "draining");
    assert!(
        nodes.claim_close(addr(0)),
        "down, the rest is the SDK's to close"
    );
}

#[test]
fn a_lost_link_changes_nothing_until_the_grace_ends() {
    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    assert!(nodes.link_lost(addr(0), now), "an outage");
    assert_eq!(nodes.next_timer(), Some(now + GRACE));
    // A timeout of the redial, later on, does not restart the grace.
    assert!(nodes.link_lost(addr(0), now + GRACE / 2));
    assert_eq!(nodes.next_timer(), Some(now + GRACE));
    nodes.tick(now + GRACE / 2);
    assert_eq!(targets(&nodes), [2, 2]);
    assert!(!nodes.claim_close(addr(0)));
    assert_eq!(nodes.status()[0].link, "lost");
    nodes.tick(now + GRACE);
    assert_eq!(targets(&nodes), [0, 4]);
    assert!(nodes.claim_close(addr(0)));
    assert_eq!(nodes.status()[0].link, "down");
    assert_eq!(nodes.next_timer(), None);
}

#[test]
fn a_link_back_within_the_grace_voids_it() {
    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    nodes.link_lost(addr(0), now);
    let (tx, _rx) = unbounded_channel();
    nodes.connected(addr(0), tx);
    nodes.demand(addr(0), demand(0, 0), now);
    assert_eq!(nodes.next_timer(), None);
    nodes.tick(now + GRACE);
    assert!(nodes.status()[0].live);
    assert_eq!(targets(&nodes), [2, 2]);
}

#[test]
fn a_refused_connect_after_the_link_ended_is_down_at_once() {
    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    // While the link is up, a refused session dial says nothing yet.
    nodes.refused(addr(0), now);
    assert!(nodes.status()[0].live);
    nodes.link_lost(addr(0), now);
    nodes.refused(addr(0), now);
    assert_eq!(nodes.status()[0].link, "down");
    assert_eq!(targets(&nodes), [0, 4]);
    assert!(nodes.claim_close(addr(0)));
    assert_eq!(nodes.next_timer(), None, "no grace left to run");
    // Back: a new link's first DEMAND makes it live again.
    let (tx, _rx) = unbounded_channel();
    nodes.connected(addr(0), tx);
    nodes.demand(addr(0), demand(0, 0), now);
    assert!(nodes.status()[0].live);
}

#[test]
fn a_refused_connect_to_a_node_never_reached_or_draining_moves_nothing() {
    let now = Instant::now();
    let mut nodes = Nodes::new(TIMING);
    nodes.set_capacity(4, now);
    nodes.update(&[addr(0)], now);
    nodes.link_lost(addr(0), now);
    nodes.refused(addr(0), now);
    assert_eq!(
        nodes.status()[0].link,
        "connecting",
        "never live: nothing to move"
    );

    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    nodes.draining(addr(0), now);
    assert!(
        !nodes.link_lost(addr(0), now),
        "a draining node's going is no outage"
    );
    // Its grace only bounds how long its sessions stay the node's to close (issue 46).
    assert_eq!(nodes.next_timer(), Some(now + GRACE));
    nodes.refused(addr(0), now);
    assert_eq!(targets(&nodes), [0, 4]);
    assert_eq!(nodes.next_timer(), None, "gone: no grace left");
}

#[test]
fn a_link_lost_while_stopping_starts_no_grace() {
    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    nodes.stop();
    nodes.link_lost(addr(0), now);
    nodes.refused(addr(0), now);
    assert_eq!(nodes.next_timer(), None);
    nodes.tick(now + GRACE);
    assert!(nodes.status()[0].live);
}

#[test]
fn a_node_that_leaves_with_its_link_up_is_asked_to_retire_everything_then_goes() {
    let (mut nodes, mut links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    lines(&mut links[0]);
    nodes.update(&[addr(1)], now);
    assert_eq!(lines(&mut links[0]), [ServiceLine::Retire(2)]);
    assert!(!nodes.claim_close(addr(0)), "RETIRE, not SDK-side closes");
    assert!(nodes.ended(addr(0)));
    assert!(nodes.ended(addr(0)));
    let (_, removed) = nodes.take_changes();
    assert_eq!(removed, [addr(0)]);
    assert_eq!(nodes.status().len(), 1);
}

#[test]
fn a_node_that_leaves_with_its_link_down_is_closed_by_the_sdk() {
    let (mut nodes, _links, now) = fleet(2, 4);
    fill(&mut nodes, now);
    nodes.link_lost(addr(0), now);
    nodes.update(&[addr(1)], now);
    assert!(nodes.claim_close(addr(0)));
}

#[test]
fn an_old_acceptor_is_live_with_demand_one_and_its_surplus_closed_by_the_sdk() {
    let now = Instant::now();
    let mut nodes = Nodes::new(TIMING);
    nodes.set_capacity(4, now);
    nodes.update(&[addr(0), addr(1)], now);
    nodes.unsupported(addr(0), now);
    nodes.unsupported(addr(1), now);
    assert_eq!(nodes.status()[0].demand, 1.0);
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [2, 2]);
    nodes.set_capacity(2, now);
    assert_eq!(targets(&nodes), [1, 1]);
    assert!(nodes.claim_close(addr(0)));
    assert!(!nodes.claim_close(addr(0)), "one owed there");
    assert!(nodes.claim_close(addr(1)));
}

#[test]
fn a_node_that_refuses_the_instance_as_drained_is_probed_once_per_interval() {
    let (mut nodes, _links, now) = fleet(2, 2);
    let Pick::Dial { addr: first, .. } = nodes.pick(now) else {
        panic!()
    };
    nodes.dialed(first, false, Dialed::Drained, now);
    assert!(!nodes.status()[0].live);
    assert_eq!(targets(&nodes), [0, 2]);
    fill(&mut nodes, now);
    assert_eq!(held(&nodes), [0, 2]);
    // Room, and the probe falls due: one slot probes, no other.
    nodes.ended(addr(1));
    let later = now + PROBE;
    assert_eq!(
        nodes.pick(now),
        Pick::Dial {
            addr: addr(1),
            probe: false
        }
    );
    nodes.dialed(addr(1), false, Dialed::Failed, now);
    assert_eq!(
        nodes.pick(later),
        Pick::Dial {
            addr: addr(0),
            probe: true
        }
    );
    assert_eq!(
        nodes.pick(later),
        Pick::Wait(None),
        "the probe counts as held"
    );
    nodes.dialed(addr(0), true, Dialed::Registered, later);
    assert!(nodes.status()[0].live, "resumed");
}

/// The sum guarantee under everything at once: random joins, leaves, demands, drains, lost
/// links, graces, drained nodes, capacity changes, dials and closes. After every step the
/// sessions held everywhere are at most the capacity, unless they were already above it
/// (a shrink) and did not grow.
#[test]
fn the_sessions_held_never_exceed_the_capacity_under_random_events() {
    for seed in 0..200 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut now = Instant::now();
        let mut nodes = Nodes::new(TIMING);
        nodes.set_capacity(rng.usize(0..10), now);
        let mut dialing: Vec<(SocketAddr, bool)> = Vec::new();
        let mut links: Vec<Option<UnboundedReceiver<ServiceLine>>> = (0..5).map(|_| None).collect();
        for _ in 0..400 {
            let before = nodes.held();
            let cap_before = nodes.capacity();
            let i = rng.usize(0..5);
            match rng.u8(0..14) {
                0 => {
                    let listed: Vec<SocketAddr> = (0..5).filter(|_| rng.bool()).map(addr).collect();
                    nodes.update(&listed, now);
                }
                1 => {
                    let (tx, rx) = unbounded_channel();
                    nodes.connected(addr(i), tx);
                    links[i] = Some(rx);
                }
                2 | 3 => nodes.demand(addr(i), demand(rng.u64(0..6), rng.u64(0..20)), now),
                4 => nodes.draining(addr(i), now),
                5 => {
                    nodes.link_lost(addr(i), now);
                }
                6 => {
                    if rng.bool() {
                        nodes.refused(addr(i), now);
                    } else {
                        nodes.tick(now);
                    }
                }
                7 => nodes.set_capacity(rng.usize(0..10), now),
                8 => {
                    if let Pick::Dial { addr, probe } = nodes.pick(now) {
                        dialing.push((addr, probe));
                    }
                }
                9 => {
                    if !dialing.is_empty() {
                        let (a, probe) = dialing.swap_remove(rng.usize(0..dialing.len()));
                        let how = [
                            Dialed::Registered,
                            Dialed::Registered,
                            Dialed::Failed,
                            Dialed::Drained,
                        ][rng.usize(0..4)];
                        nodes.dialed(a, probe, how, now);
                    }
                }
                10 => {
                    // The node carries out a RETIRE, or closes a session for reasons of its own.
                    if let Some(rx) = &mut links[i] {
                        for line in lines(rx) {
                            if let ServiceLine::Retire(n) = line {
                                for _ in 0..n {
                                    if nodes.get(addr(i)).is_some_and(|n| n.registered > 0) {
                                        nodes.ended(addr(i));
                                    }
                                }
                            }
                        }
                    }
                    if rng.u8(0..4) == 0 && nodes.get(addr(i)).is_some_and(|n| n.registered > 0) {
                        nodes.ended(addr(i));
                    }
                }
                11 => {
                    if nodes.get(addr(i)).is_some_and(|n| n.registered > 0)
                        && nodes.claim_close(addr(i))
                    {
                        nodes.ended(addr(i));
                    }
                }
                12 => nodes.unsupported(addr(i), now),
                _ => now += Duration::from_secs(rng.u64(0..40)),
            }
            let after = nodes.held();
            assert!(
                after <= nodes.capacity() || after <= before,
                "seed {seed}: held {before} -> {after}, capacity {cap_before} -> {}",
                nodes.capacity()
            );
            let status = nodes.status();
            for s in &status {
                assert!(
                    s.retiring <= s.registered && s.registered <= s.held,
                    "seed {seed}: {s:?}"
                );
            }
            let dialing_here: usize = dialing.len();
            let registered: usize = status.iter().map(|s| s.registered).sum();
            assert_eq!(registered + dialing_here, after, "seed {seed}");
        }
    }
}
