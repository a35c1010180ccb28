//! Time to first byte over the emulated WAN (legs 30 / 200 / 25 ms RTT, 100 Mbit/s), in units
//! of the end-to-end RTT: a pooled relay chain must beat the direct path by a wide margin.
//! Needs root (namespaces, TUN devices); CI runs as root. Budget: about 10 s.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_wan::bed::{Bed, Leg};
use sluice_wan::programs::relay_in;

const EXE: &str = env!("CARGO_BIN_EXE_sluice-wan");
const RTT_MS: f64 = 255.0;

fn legs() -> [Leg; 3] {
    let leg = |ms| Leg {
        rtt: Duration::from_millis(ms),
        rate_bps: 100_000_000,
        loss: 0.0,
    };
    [leg(30), leg(200), leg(25)]
}

fn relays() -> Vec<sluice_config::Relay> {
    let text = "[[relay]]\nname = \"core\"\nlisten = \"10.2.0.2:7100\"\ntunnel = true\n\
                tokens = [\"wan-token\"]\nallow = [\"10.3.0.2:8000\"]\n\
                [[relay]]\nname = \"edge\"\nlisten = \"10.1.0.2:7000\"\nto = \"10.2.0.2:7100\"\n\
                target = \"10.3.0.2:8000\"\ntoken = \"wan-token\"\npool = 4\n";
    sluice_config::parse_str(text, "wan.toml", Path::new("."))
        .unwrap()
        .relays
}

/// TTFB of a 10 KB fetch from the client namespace, in RTT units.
fn ttfb_rtts(bed: &Bed, addr: &str) -> f64 {
    let out = bed
        .run(0, &["timeout", "20", EXE, "fetch", addr, "10000"])
        .unwrap();
    let ttfb: f64 = out.split_whitespace().next().unwrap().parse().unwrap();
    ttfb / RTT_MS
}

#[test]
fn a_pooled_relay_chain_cuts_time_to_first_byte_by_most_of_a_round_trip() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the WAN test bed needs root (namespaces, TUN devices)"
    );
    let mut bed = Bed::new(legs()).unwrap();
    let server = bed.spawn(3, &[EXE, "serve", "10.3.0.2:8000"]).unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let [core, edge] = <[_; 2]>::try_from(relays()).unwrap();
    relay_in(&bed.ns[2], core).unwrap();
    let edge = relay_in(&bed.ns[1], edge).unwrap();
    // The pool fills over the long leg; the wait is bounded, not a timed assertion.
    let deadline = Instant::now() + Duration::from_secs(20);
    while edge.stats.snapshot().pool_idle < 4 {
        assert!(Instant::now() < deadline, "the pool never filled");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Direct: the client's handshake and its request each cross the whole path (2 RTT).
    let direct = ttfb_rtts(&bed, "10.3.0.2:8000");
    // Pooled: the first leg's handshake, one end-to-end trip, and the last leg's handshake
    // (about 1.2 RTT).
    let pooled = ttfb_rtts(&bed, "10.1.0.2:7000");
    eprintln!("TTFB in RTTs: direct {direct:.2}, pooled relays {pooled:.2}");
    assert!(
        direct >= 1.8,
        "direct TTFB {direct:.2} RTT: the bed's delay is missing"
    );
    assert!(
        pooled <= 1.5,
        "pooled TTFB {pooled:.2} RTT: the pool did not save a round trip"
    );
    assert_eq!(edge.stats.snapshot().pool_misses, 0);
}
