//! The four namespaces (client, relay1, relay2, server) and the three emulated links between
//! them, made for one run and removed when the [`Bed`] is dropped (also on a panic).

use std::io;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use crate::link::{self, Shape};

/// The addresses inside the bed (private to its namespaces).
pub const CLIENT: &str = "10.1.0.1";
/// Relay 1 on the client's leg.
pub const RELAY1: &str = "10.1.0.2";
/// Relay 2 on the long leg.
pub const RELAY2: &str = "10.2.0.2";
/// The server.
pub const SERVER: &str = "10.3.0.2";

/// One leg: round-trip time, rate and loss (each direction gets half the RTT).
#[derive(Debug, Clone, Copy)]
pub struct Leg {
    /// Round-trip propagation time.
    pub rtt: Duration,
    /// Bits per second, each direction.
    pub rate_bps: u64,
    /// Loss probability, each direction.
    pub loss: f64,
}

/// The namespaces and links of one run.
#[derive(Debug)]
pub struct Bed {
    /// Namespace names: client, relay1, relay2, server.
    pub ns: [String; 4],
    /// What every namespace and TUN device name of this run starts with.
    prefix: String,
    children: Vec<Child>,
}

static RUNS: AtomicUsize = AtomicUsize::new(0);

impl Bed {
    /// Builds the bed with `legs` (client–relay1, relay1–relay2, relay2–server). Needs root.
    pub fn new(legs: [Leg; 3]) -> io::Result<Self> {
        let prefix = format!("sw{}x{}", std::process::id(), RUNS.fetch_add(1, Relaxed));
        let ns = ["c", "a", "b", "s"].map(|n| format!("{prefix}{n}"));
        let bed = Self {
            ns,
            prefix: prefix.clone(),
            children: Vec::new(),
        };
        for ns in &bed.ns {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            exec(ns, &["sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1"])?;
            exec(ns, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
            // No router solicitations or DAD on the links: only the test's own traffic.
            exec(ns, &["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
            exec(
                ns,
                &["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"],
            )?;
        }
        let addrs = [
            ("10.1.0.1", "10.1.0.2"),
            ("10.2.0.1", "10.2.0.2"),
            ("10.3.0.1", "10.3.0.2"),
        ];
        for (i, (leg, (left, right))) in legs.iter().zip(addrs).enumerate() {
            bed.link(i, &prefix, *leg, left, right)?;
        }
        // Routes for IP forwarding through the relays' namespaces (the "direct" path).
        ip(&[
            "-n",
            &bed.ns[0],
            "route",
            "add",
            "default",
            "dev",
            &format!("{prefix}0l"),
        ])?;
        ip(&[
            "-n",
            &bed.ns[1],
            "route",
            "add",
            "10.3.0.0/24",
            "dev",
            &format!("{prefix}1l"),
        ])?;
        ip(&[
            "-n",
            &bed.ns[2],
            "route",
            "add",
            "10.1.0.0/24",
            "dev",
            &format!("{prefix}1r"),
        ])?;
        ip(&[
            "-n",
            &bed.ns[3],
            "route",
            "add",
            "default",
            "dev",
            &format!("{prefix}2r"),
        ])?;
        bed.verify(&prefix)?;
        Ok(bed)
    }

    /// The long leg's tuning as README documents it: the relays' routes to each other start
    /// connections with `initcwnd`/`initrwnd` segments, and keep their window over idle time.
    pub fn tune_long_leg(&self, segments: u32) -> io::Result<()> {
        let prefix = &self.prefix;
        let n = segments.to_string();
        for (ns, dev, me, peer) in [
            (&self.ns[1], format!("{prefix}1l"), "10.2.0.1", "10.2.0.2"),
            (&self.ns[2], format!("{prefix}1r"), "10.2.0.2", "10.2.0.1"),
        ] {
            let route = [
                "-n", ns, "route", "change", peer, "dev", &dev, "proto", "kernel", "scope", "link",
                "src", me, "initcwnd", &n, "initrwnd", &n,
            ];
            ip(&route)?;
            exec(
                ns,
                &["sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0"],
            )?;
        }
        Ok(())
    }

    /// Link `i` between namespace `i` and `i + 1`, its TUN ends named `<prefix><i>l/r`.
    fn link(&self, i: usize, prefix: &str, leg: Leg, left: &str, right: &str) -> io::Result<()> {
        let (l, r) = (format!("{prefix}{i}l"), format!("{prefix}{i}r"));
        let (a, b) = (crate::tun::create(&l)?, crate::tun::create(&r)?);
        let delay = leg.rtt / 2;
        let bdp = (leg.rate_bps as f64 * delay.as_secs_f64() / 8.0) as usize;
        let shape = Shape {
            delay,
            rate_bps: leg.rate_bps,
            loss: leg.loss,
            queue_bytes: bdp + 512 * 1024,
        };
        link::spawn(a, b, shape)?;
        for (dev, ns, me, peer) in [
            (&l, &self.ns[i], left, right),
            (&r, &self.ns[i + 1], right, left),
        ] {
            ip(&["link", "set", "dev", dev, "netns", ns])?;
            ip(&["-n", ns, "addr", "add", me, "peer", peer, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// Checks that every namespace and TUN end exists where it should before traffic flows.
    fn verify(&self, prefix: &str) -> io::Result<()> {
        let ends = [
            (0, "0l"),
            (1, "0r"),
            (1, "1l"),
            (2, "1r"),
            (2, "2l"),
            (3, "2r"),
        ];
        for (ns, end) in ends {
            ip(&[
                "-n",
                &self.ns[ns],
                "link",
                "show",
                "dev",
                &format!("{prefix}{end}"),
            ])?;
        }
        Ok(())
    }

    /// Starts `args` (a program and its arguments) inside namespace `ns` (0..4); it is killed
    /// when the bed is dropped.
    pub fn spawn(&mut self, ns: usize, args: &[&str]) -> io::Result<&mut Child> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns[ns]])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()?;
        self.children.push(child);
        let last = self.children.len() - 1;
        Ok(&mut self.children[last])
    }

    /// Runs `args` inside namespace `ns` to the end; its stdout.
    pub fn run(&self, ns: usize, args: &[&str]) -> io::Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns[ns]])
            .args(args)
            .output()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(io::Error::other(format!("{args:?} failed: {err}")));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Kills every program started with [`spawn`](Self::spawn).
    pub fn stop_all(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.stop_all();
        // Deleting a namespace deletes the TUN devices in it; the link threads then end.
        for ns in &self.ns {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    match out.status.success() {
        true => Ok(()),
        false => Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

fn exec(ns: &str, args: &[&str]) -> io::Result<()> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    ip(&all)
}
