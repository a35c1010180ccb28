//! `sluice-wan`: the WAN test bed's programs, and its benchmark.
//!
//! ```text
//! sluice-wan serve ADDR              sized responses (inside the server namespace)
//! sluice-wan fetch ADDR SIZE         prints "<ttfb ms> <total ms>"
//! sluice-wan relay CONFIG            the [[relay]]s of CONFIG
//! sluice-wan bench LOSS ROUNDS [MAX_SIZE [VARIANTS]]
//!                                    the relay benchmark over a fresh bed (needs root); VARIANTS
//!                                    (comma-separated names) runs those and `direct` only
//! sluice-wan cpu GB                  relay CPU seconds per GB, splice and copy, on loopback
//! sluice-wan sockmap ROUNDS GB       kernel splicing (sockmap) against splice(2), on loopback:
//!                                    interleaved rounds with an A/A pair (needs root)
//! ```

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::Duration;

use sluice_wan::bed::{Bed, Leg};
use sluice_wan::programs;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).ok_or("missing argument");
    match arg(0)? {
        "serve" => programs::serve(arg(1)?.parse()?)?,
        "fetch" => {
            let (ttfb, total) = programs::fetch(arg(1)?.parse()?, arg(2)?.parse()?)?;
            println!("{ttfb:.1} {total:.1}");
        }
        "relay" => programs::relay(Path::new(arg(1)?))?,
        "bench" => bench(
            arg(1)?.parse()?,
            arg(2)?.parse()?,
            arg(3).unwrap_or("10000000").parse()?,
            arg(4).ok(),
        )?,
        "cpu" => cpu(arg(1)?.parse()?)?,
        "sockmap" => sockmap(arg(1)?.parse()?, arg(2)?.parse()?)?,
        other => return Err(format!("unknown command {other}").into()),
    }
    Ok(())
}

/// The issue's legs: 30 / 200 / 25 ms RTT, 100 Mbit/s, `loss` on the long leg.
pub fn legs(loss: f64) -> [Leg; 3] {
    let leg = |ms, loss| Leg {
        rtt: Duration::from_millis(ms),
        rate_bps: 100_000_000,
        loss,
    };
    [leg(30, 0.0), leg(200, loss), leg(25, 0.0)]
}

/// The variants, each adding one step to the previous: (name, entry relay keys). The tuning
/// keys go to the tunnel end too; `route = N` tunes the long leg's routes (`initcwnd` and
/// `initrwnd` N, no slow start after idle) from then on;
/// `end_pool = N` gives the tunnel end a pool of N towards the server (`pool_targets`).
/// `+window` is README's window for this path: 256 segments, about 15 % of the long leg's
/// bandwidth-delay product (100 Mbit/s x 200 ms, 1 700 segments), where `+route` has 32.
const VARIANTS: &[(&str, &str)] = &[
    ("naive", "splice = false\n"),
    ("+pool", "splice = false\npool = 8\n"),
    ("+early", "splice = false\npool = 8\nearly_connect = true\n"),
    ("+tuning", "splice = false\npool = 8\nearly_connect = true\ncongestion = \"bbr\"\nsocket_buffer = \"8MiB\"\n"),
    ("+splice", "pool = 8\nearly_connect = true\ncongestion = \"bbr\"\nsocket_buffer = \"8MiB\"\n"),
    ("+route", "pool = 8\nearly_connect = true\ncongestion = \"bbr\"\nsocket_buffer = \"8MiB\"\nroute = 32\n"),
    ("+end pool", "pool = 8\nearly_connect = true\ncongestion = \"bbr\"\nsocket_buffer = \"8MiB\"\nroute = 32\nend_pool = 8\n"),
    ("+window", "pool = 8\nearly_connect = true\ncongestion = \"bbr\"\nsocket_buffer = \"8MiB\"\nroute = 256\nend_pool = 8\n"),
];

const SIZES: &[(&str, u64)] = &[
    ("10KB", 10_000),
    ("100KB", 100_000),
    ("1MB", 1_000_000),
    ("10MB", 10_000_000),
];

fn bench(
    loss: f64,
    rounds: usize,
    max_size: u64,
    only: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    if rounds == 0 {
        return Err("ROUNDS must be at least 1".into());
    }
    let variants = variants(only)?;
    let me = std::env::current_exe()?;
    let me = me.to_str().ok_or("exe path")?;
    let mut bed = Bed::new(legs(loss))?;
    let dir = std::env::temp_dir().join(format!("sluice-wan-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    wait_ready(bed.spawn(3, &[me, "serve", "10.3.0.2:8000"])?)?;
    let rtt = 255.0;
    println!(
        "| variant | size | TTFB ms (median of {rounds}) | TTFB / RTT | total ms (median) | total ms (min-max) |"
    );
    println!("|---|---|---|---|---|---|");
    for &(name, keys) in std::iter::once(&("direct", "")).chain(variants) {
        if let Some(n) = keys.lines().find_map(|l| l.strip_prefix("route = ")) {
            bed.tune_long_leg(n.parse()?)?;
        }
        let addr = if name == "direct" {
            "10.3.0.2:8000"
        } else {
            start_relays(&mut bed, me, &dir, name, keys)?;
            "10.1.0.2:7000"
        };
        for (label, size) in SIZES.iter().filter(|(_, s)| *s <= max_size) {
            let mut ttfbs = Vec::new();
            let mut totals = Vec::new();
            for _ in 0..rounds {
                // Let the pool refill between fetches, as between independent clients.
                std::thread::sleep(Duration::from_millis(300));
                let out = bed.run(0, &[me, "fetch", addr, &size.to_string()])?;
                let mut it = out.split_whitespace().map(str::parse::<f64>);
                ttfbs.push(it.next().ok_or("no ttfb")??);
                totals.push(it.next().ok_or("no total")??);
            }
            let (t, total) = (median(&mut ttfbs), median(&mut totals));
            // `median` sorted them: the spread is the ends.
            let (least, most) = (totals.first(), totals.last());
            let (least, most) = (
                least.copied().unwrap_or(f64::NAN),
                most.copied().unwrap_or(f64::NAN),
            );
            println!(
                "| {name} | {label} | {t:.0} | {:.2} | {total:.0} | {least:.0}-{most:.0} |",
                t / rtt
            );
        }
        if name != "direct" {
            bed.stop_all();
            wait_ready(bed.spawn(3, &[me, "serve", "10.3.0.2:8000"])?)?;
        }
    }
    Ok(())
}

/// The variants `only` names (comma-separated), in their order; every one without it. `direct`
/// always runs first, named or not.
fn variants(only: Option<&str>) -> Result<Vec<&'static (&'static str, &'static str)>, String> {
    let Some(only) = only else {
        return Ok(VARIANTS.iter().collect());
    };
    let names: Vec<&str> = only
        .split(',')
        .map(str::trim)
        .filter(|n| *n != "direct")
        .collect();
    if let Some(unknown) = names
        .iter()
        .find(|n| !VARIANTS.iter().any(|(v, _)| v == *n))
    {
        let all: Vec<&str> = VARIANTS.iter().map(|(v, _)| *v).collect();
        return Err(format!(
            "unknown variant {unknown:?}; the variants: {}",
            all.join(", ")
        ));
    }
    Ok(VARIANTS.iter().filter(|(v, _)| names.contains(v)).collect())
}

fn start_relays(
    bed: &mut Bed,
    me: &str,
    dir: &Path,
    name: &str,
    keys: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let lines = |keep: &dyn Fn(&str) -> bool| -> String {
        keys.lines()
            .filter(|l| keep(l))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let bench_only = |l: &str| l.starts_with("end_pool") || l.starts_with("route");
    let entry_only = |l: &str| l.starts_with("pool") || l.starts_with("early");
    let mut tuning = lines(&|l| !entry_only(l) && !bench_only(l));
    if let Some(n) = keys.lines().find_map(|l| l.strip_prefix("end_pool = ")) {
        tuning.push_str(&format!("pool_targets = [\"10.3.0.2:8000\"]\npool = {n}\n"));
    }
    let core = format!(
        "[[relay]]\nname = \"core\"\nlisten = \"10.2.0.2:7100\"\ntunnel = true\ntokens = [\"bench-token\"]\nallow = [\"10.3.0.2:8000\"]\n{tuning}"
    );
    let keys = lines(&|l| !bench_only(l));
    let edge = format!(
        "[[relay]]\nname = \"edge\"\nlisten = \"10.1.0.2:7000\"\nto = \"10.2.0.2:7100\"\ntarget = \"10.3.0.2:8000\"\ntoken = \"bench-token\"\n{keys}"
    );
    let slug: String = name.chars().filter(char::is_ascii_alphanumeric).collect();
    let (core_path, edge_path) = (
        dir.join(format!("{slug}-core.toml")),
        dir.join(format!("{slug}-edge.toml")),
    );
    std::fs::write(&core_path, core)?;
    std::fs::write(&edge_path, edge)?;
    wait_ready(bed.spawn(2, &[me, "relay", core_path.to_str().ok_or("path")?])?)?;
    wait_ready(bed.spawn(1, &[me, "relay", edge_path.to_str().ok_or("path")?])?)?;
    // The pool fills over the long leg: one RTT and a little.
    std::thread::sleep(Duration::from_millis(600));
    Ok(())
}

fn wait_ready(child: &mut std::process::Child) -> Result<(), Box<dyn std::error::Error>> {
    let out = child.stdout.take().ok_or("no stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line)?;
    match line.trim() {
        "ready" => Ok(()),
        other => Err(format!("program did not start: {other:?}").into()),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Pushes `gb` GB through a plain relay (its own process) on loopback, with splice and with
/// copy, and prints the relay process's CPU seconds per GB for each.
fn cpu(gb: u64) -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("sluice-wan-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("| forwarding | relay CPU s per GB | GB moved |");
    println!("|---|---|---|");
    for (name, keys) in [
        ("splice(2)", "splice = true\n"),
        ("copy (64 KiB buffer)", "splice = false\n"),
    ] {
        let run = push(&dir, keys, gb)?;
        println!(
            "| {name} | {:.3} | {:.1} |",
            run.relay_cpu / run.gib,
            run.gib
        );
    }
    Ok(())
}

/// Kernel splicing (`sockmap`) against `splice(2)` on loopback: `rounds` rounds, each pushing
/// `gb` GB through a relay in each of splice, sockmap and splice again (the A/A pair), in that
/// order; prints each round, then the medians' ratios to the first splice.
fn sockmap(rounds: usize, gb: u64) -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("sluice-wan-sockmap-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let variants = [
        ("splice A", "splice = true\n"),
        ("sockmap", "sockmap = true\n"),
        ("splice B", "splice = true\n"),
    ];
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); variants.len()];
    println!("| round | variant | GiB/s | relay CPU s per GiB | relay + kworkers CPU s per GiB | machine CPU s per GiB |");
    println!("|---|---|---|---|---|---|");
    for round in 1..=rounds {
        for (i, (name, keys)) in variants.iter().enumerate() {
            let run = push(&dir, keys, gb)?;
            println!(
                "| {round} | {name} | {:.2} | {:.3} | {:.3} | {:.3} |",
                run.gib / run.secs,
                run.relay_cpu / run.gib,
                (run.relay_cpu + run.kworker_cpu) / run.gib,
                run.machine_cpu / run.gib
            );
            runs[i].push(run);
        }
    }
    let med = |i: usize, f: fn(&Run) -> f64| median(&mut runs[i].iter().map(f).collect::<Vec<_>>());
    let rate = |r: &Run| r.gib / r.secs;
    let relay = |r: &Run| r.relay_cpu / r.gib;
    let with_kworkers = |r: &Run| (r.relay_cpu + r.kworker_cpu) / r.gib;
    let machine = |r: &Run| r.machine_cpu / r.gib;
    println!();
    println!("| variant / splice A (medians) | throughput | relay CPU per GiB | relay + kworkers CPU per GiB | machine CPU per GiB |");
    println!("|---|---|---|---|---|");
    for (i, (name, _)) in variants.iter().enumerate() {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
            med(i, rate) / med(0, rate),
            med(i, relay) / med(0, relay),
            med(i, with_kworkers) / med(0, with_kworkers),
            med(i, machine) / med(0, machine)
        );
    }
    Ok(())
}

/// One transfer through a relay.
#[derive(Debug, Clone, Copy)]
struct Run {
    gib: f64,
    secs: f64,
    /// The relay process's user + system CPU seconds.
    relay_cpu: f64,
    /// The kernel's worker threads' CPU seconds (`kworker/*`: they send what a sockmap
    /// redirects; on a shared machine others' work too).
    kworker_cpu: f64,
    /// Every CPU's busy seconds meanwhile (the kernel's workers too, which forward a sockmap's
    /// bytes; also the sender and the sink, and whatever else runs on the machine).
    machine_cpu: f64,
}

/// Pushes `gb` GiB through a plain relay (its own process, the configuration's relay keys
/// `keys`) to a sink on loopback.
fn push(dir: &Path, keys: &str, gb: u64) -> Result<Run, Box<dyn std::error::Error>> {
    use std::io::{Read, Write};
    let sink = std::net::TcpListener::bind("127.0.0.1:0")?;
    let sink_addr = sink.local_addr()?;
    let drain = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut conn, _) = sink.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match conn.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    // A free port for the relay: bind, note, release (loopback only, this process's run).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let path = dir.join("relay.toml");
    std::fs::write(
        &path,
        format!("[[relay]]\nname = \"cpu\"\nlisten = \"127.0.0.1:{port}\"\nto = \"{sink_addr}\"\n{keys}"),
    )?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("relay")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    wait_ready(&mut child)?;
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port))?;
    let (before, machine_before) = (cpu_seconds(child.id())?, machine_busy()?);
    let kworkers_before = kworker_seconds();
    let start = std::time::Instant::now();
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..gb * 1024 {
        conn.write_all(&chunk)?;
    }
    conn.shutdown(std::net::Shutdown::Write)?;
    let moved = drain.join().map_err(|_| "sink panicked")??;
    let secs = start.elapsed().as_secs_f64();
    let relay_cpu = cpu_seconds(child.id())? - before;
    let machine_cpu = machine_busy()? - machine_before;
    let kworker_cpu = kworker_seconds() - kworkers_before;
    let _ = child.kill();
    let _ = child.wait();
    let gib = moved as f64 / f64::from(1u32 << 30);
    Ok(Run {
        gib,
        secs,
        relay_cpu,
        kworker_cpu,
        machine_cpu,
    })
}

/// User + system CPU seconds of every kernel worker thread (`kworker/…`) now.
fn kworker_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("kworker"))
        })
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| cpu_seconds(pid).ok())
        .sum()
}

/// Busy seconds of every CPU together (/proc/stat's first line: all but idle and iowait, in
/// clock ticks of 100 Hz).
fn machine_busy() -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().ok_or("empty /proc/stat")?;
    let ticks: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let busy: f64 = ticks
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    Ok(busy / 100.0)
}

/// User + system CPU seconds of process `pid` (/proc/PID/stat, clock ticks of 100 Hz).
fn cpu_seconds(pid: u32) -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_comm = stat.rsplit_once(')').ok_or("bad stat")?.1;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let utime: f64 = fields.get(11).ok_or("no utime")?.parse()?;
    let stime: f64 = fields.get(12).ok_or("no stime")?.parse()?;
    Ok((utime + stime) / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_list_keeps_the_benchs_order_and_refuses_unknown_names() {
        let all = variants(None).expect("all");
        assert_eq!(all.len(), VARIANTS.len());
        let some = variants(Some("+window, +splice,direct")).expect("two");
        let names: Vec<&str> = some.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["+splice", "+window"]);
        let err = variants(Some("+splice,+windows")).expect_err("a typo");
        assert!(
            err.contains("\"+windows\"") && err.contains("+end pool"),
            "{err}"
        );
    }
}
