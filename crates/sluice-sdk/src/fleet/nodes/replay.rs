//! Every scenario of `protocol/vectors/fleet.json` (its `_doc` says how to replay one),
//! against the books on tokio's paused clock, without sockets: each event is the call the
//! control link (`link.rs`) or a session slot (`Lease`) makes for it, the clock stops at every
//! timer of the rules on its way (as the fleet's timer task and the waiting slots do), and
//! the slots dial wherever [`Nodes::pick`] lets them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Map, Value};
use sluice_session::control::{NodeLine, ServiceLine};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::Instant;

use super::{Dialed, Nodes, Pick, Timing};

/// Per node name: how many.
type Tally = BTreeMap<String, u64>;

/// One scenario's SDK side: the books, the links' receiving ends, and what the SDK did.
struct Replay {
    nodes: Nodes,
    capacity: usize,
    start: Instant,
    /// Node names in the order they were first named: node `i` is `192.0.2.(i+1):7070`.
    names: Vec<String>,
    /// Each node's current link; lines written to earlier links are tallied when replaced.
    links: BTreeMap<String, UnboundedReceiver<ServiceLine>>,
    /// Session dials under way, by node.
    dialing: Tally,
    /// A slot waits until this instant ([`Pick::Wait`]).
    wake: Option<Instant>,
    retire: Tally,
    dials: Tally,
    closes: Tally,
}

impl Replay {
    fn new(options: &Value) -> Self {
        let secs = |key: &str| Duration::from_secs_f64(options[key].as_f64().unwrap());
        let timing = Timing {
            probe_every: Duration::from_secs(30),
            node_grace: secs("node_grace"),
            first_wait: secs("handshake_timeout"),
            // No jitter: the scenarios name the instants a backing-off node is dialed again.
            backoff: crate::options::Backoff {
                initial: Duration::from_secs_f64(
                    options["backoff"]["initial"].as_f64().unwrap_or(0.1),
                ),
                max: Duration::from_secs_f64(options["backoff"]["max"].as_f64().unwrap_or(5.0)),
                jitter: 0.0,
            },
        };
        let capacity = options["capacity"].as_u64().unwrap() as usize;
        let start = Instant::now();
        let mut nodes = Nodes::new(timing);
        nodes.set_capacity(capacity, start);
        Self {
            nodes,
            capacity,
            start,
            names: Vec::new(),
            links: BTreeMap::new(),
            dialing: Tally::new(),
            wake: None,
            retire: Tally::new(),
            dials: Tally::new(),
            closes: Tally::new(),
        }
    }

    fn addr(&mut self, name: &str) -> SocketAddr {
        let i = match self.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_owned());
                self.names.len() - 1
            }
        };
        SocketAddr::from(([192, 0, 2, u8::try_from(i + 1).unwrap()], 7070))
    }

    /// Runs one step and returns what the SDK did, in the shape of its `expect`.
    async fn step(&mut self, step: &Value) -> Value {
        self.retire.clear();
        self.dials.clear();
        self.closes.clear();
        let at = self.start + Duration::from_secs_f64(step["at"].as_f64().unwrap());
        self.run_until(at).await;
        self.settle();
        for event in step["do"].as_array().unwrap() {
            self.event(event);
            self.check_sum();
        }
        self.settle();
        self.seen(&step["expect"])
    }

    /// Moves the clock to `at`, stopping at every timer that falls due on the way.
    async fn run_until(&mut self, at: Instant) {
        loop {
            let next = [self.nodes.next_timer(), self.wake]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(timer) if timer <= at => {
                    advance_to(timer).await;
                    self.wake = None;
                    self.nodes.tick(Instant::now());
                    self.settle();
                }
                _ => break,
            }
        }
        advance_to(at).await;
    }

    /// Sessions the SDK closes itself end at once (all are idle), and the slots dial
    /// wherever the rules let them, until neither happens.
    fn settle(&mut self) {
        while self.close_owed() | self.dial() {}
    }

    fn close_owed(&mut self) -> bool {
        let mut closed = false;
        for name in self.names.clone() {
            let addr = self.addr(&name);
            let registered = self.nodes.get(addr).map_or(0, |n| n.registered);
            for _ in 0..registered {
                if self.nodes.claim_close(addr) {
                    self.nodes.ended(addr);
                    *self.closes.entry(name.clone()).or_default() += 1;
                    closed = true;
                }
            }
        }
        closed
    }

    fn dial(&mut self) -> bool {
        let mut dialed = false;
        loop {
            match self.nodes.pick(Instant::now()) {
                Pick::Dial { addr, probe } => {
                    assert!(!probe, "no scenario drains the instance");
                    let name = self.name(addr);
                    *self.dials.entry(name.clone()).or_default() += 1;
                    *self.dialing.entry(name).or_default() += 1;
                    dialed = true;
                    self.check_sum();
                }
                Pick::Wait(until) => {
                    self.wake = until;
                    return dialed;
                }
                Pick::End => panic!("the books stopped"),
            }
        }
    }

    fn name(&self, addr: SocketAddr) -> String {
        let std::net::IpAddr::V4(ip) = addr.ip() else {
            panic!("{addr}")
        };
        self.names[usize::from(ip.octets()[3]) - 1].clone()
    }

    fn check_sum(&self) {
        assert!(
            self.nodes.held() <= self.capacity,
            "{} sessions held or being dialed",
            self.nodes.held()
        );
    }

    fn event(&mut self, event: &Value) {
        let kind = event[0].as_str().unwrap();
        let now = Instant::now();
        if kind == "resolve" {
            let names: Vec<&str> = event[1]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap())
                .collect();
            let listed: Vec<SocketAddr> = names.iter().map(|n| self.addr(n)).collect();
            self.nodes.update(&listed, now);
            return;
        }
        let name = event[1].as_str().unwrap().to_owned();
        let addr = self.addr(&name);
        let count = || event[2].as_u64().unwrap();
        match kind {
            "up" => {
                let (tx, rx) = unbounded_channel();
                self.nodes.connected(addr, tx);
                if let Some(mut old) = self.links.insert(name.clone(), rx) {
                    self.tally_retires(&name, &mut old);
                }
            }
            "line" => match NodeLine::parse(event[2].as_str().unwrap()).unwrap() {
                NodeLine::Demand(d) => self.nodes.demand(addr, d, now),
                NodeLine::Draining => self.nodes.draining(addr, now),
                NodeLine::Floor(asks) => self.nodes.floor(addr, asks),
            },
            "lost" => {
                self.nodes.link_lost(addr, now);
            }
            "refused" => {
                self.nodes.link_failed(addr, true, now);
            }
            "timeout" => {
                self.nodes.link_failed(addr, false, now);
            }
            "registered" => {
                for _ in 0..count() {
                    let dialing = self.dialing.entry(name.clone()).or_default();
                    assert!(*dialing > 0, "a session registered at {name}, none dialed");
                    *dialing -= 1;
                    self.nodes.dialed(addr, false, Dialed::Registered, now);
                }
            }
            "failed" => {
                for _ in 0..count() {
                    let dialing = self.dialing.entry(name.clone()).or_default();
                    assert!(*dialing > 0, "a session dial failed at {name}, none dialed");
                    *dialing -= 1;
                    // As `Lease::failed` does: the node backs off, then the dial ends.
                    self.nodes.back_off(addr, now);
                    self.nodes.dialed(addr, false, Dialed::Failed, now);
                }
            }
            "closed" => {
                for _ in 0..count() {
                    let open = self.nodes.get(addr).is_some_and(|n| n.registered > 0);
                    assert!(open, "a session closed at {name}, none open");
                    self.nodes.ended(addr);
                }
            }
            other => panic!("unknown event {other:?}"),
        };
    }

    /// Adds the `RETIRE`s written to `link` to `name`'s tally.
    fn tally_retires(&mut self, name: &str, link: &mut UnboundedReceiver<ServiceLine>) {
        while let Ok(line) = link.try_recv() {
            if let ServiceLine::Retire(n) = line {
                *self.retire.entry(name.to_owned()).or_default() += n;
            }
        }
    }

    /// What the SDK did since the step began, in the shape of `expect`.
    fn seen(&mut self, expect: &Value) -> Value {
        let mut links = std::mem::take(&mut self.links);
        for (name, link) in &mut links {
            self.tally_retires(name, link);
        }
        self.links = links;
        let mut out = Map::new();
        for (key, tally) in [
            ("retire", &self.retire),
            ("dials", &self.dials),
            ("closes", &self.closes),
        ] {
            out.insert(key.into(), json!(tally));
        }
        if let Some(want) = expect.get("targets").and_then(Value::as_object) {
            let got: Map<String, Value> = want
                .keys()
                .map(|n| (n.clone(), json!(self.node(n).target)))
                .collect();
            out.insert("targets".into(), Value::Object(got));
        }
        if let Some(want) = expect.get("live").and_then(Value::as_object) {
            let got: Map<String, Value> = want
                .keys()
                .map(|n| (n.clone(), json!(self.node(n).live())))
                .collect();
            out.insert("live".into(), Value::Object(got));
        }
        Value::Object(out)
    }

    fn node(&mut self, name: &str) -> &super::Node {
        let addr = self.addr(name);
        self.nodes.get(addr).unwrap()
    }
}

/// Moves the paused clock forward to `at` (not back).
async fn advance_to(at: Instant) {
    let now = Instant::now();
    if at > now {
        tokio::time::advance(at - now).await;
    }
    assert_eq!(Instant::now(), at.max(now));
}

/// `expect` with `retire`, `dials` and `closes` always present (empty: none).
fn completed(expect: &Value) -> Value {
    let mut want = expect.as_object().unwrap().clone();
    for key in ["retire", "dials", "closes"] {
        want.entry(key).or_insert_with(|| json!({}));
    }
    Value::Object(want)
}

#[tokio::test(start_paused = true)]
async fn every_fleet_scenario_replays_as_its_vector_says() {
    let path = sluice_session::vectors::path().with_file_name("fleet.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let vectors: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(vectors["version"], 1);
    let scenarios = vectors["scenarios"].as_array().unwrap();
    assert!(scenarios.len() >= 10);
    let mut failed = Vec::new();
    for scenario in scenarios {
        let name = scenario["name"].as_str().unwrap();
        let mut replay = Replay::new(&scenario["options"]);
        for (i, step) in scenario["steps"].as_array().unwrap().iter().enumerate() {
            let got = replay.step(step).await;
            let want = completed(&step["expect"]);
            if got != want {
                let (at, events) = (&step["at"], &step["do"]);
                failed.push(format!(
                    "{name}\n  step {i} at {at}s: {events}\n  want {want}\n  got  {got}"
                ));
                break;
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
