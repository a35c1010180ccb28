"""Processes the harness starts (pinned, in their own process groups, stopped by PID) and the
per-process and machine counters it reads from /proc around each run."""

import os
import random
import select
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024

# Where the bench places things: the proxy under test alone on CPU 1; the load generator and
# every backend share CPU 0 (measured here: far steadier ratios than leaving them unpinned).
PROXY_CPU = 1
LOAD_CPU = 0


# Ports handed out by `free_port`, so that one run never gets the same one twice.
_GIVEN = set()


def _ephemeral_low():
    """The lowest port the kernel gives connections that bind none (their local port)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A port free on 127.0.0.1 now, for a process about to listen on it. Drawn below the
    kernel's ephemeral range: a run opens thousands of connections, each taking a local port
    from that range, and one of them took a port picked there before its listener could bind
    it (CI: `bench-backend: cannot listen ...: Address already in use`)."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, max(low, 10001))
        if port in _GIVEN or port >= low:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f} s")


class Group:
    """Every process one benchmark run started; `close` stops them all (SIGTERM to each process
    group, SIGKILL after a grace period), so nothing outlives the harness."""

    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.procs = []

    def start(self, name, cmd, cpu, stdout_pipe=False):
        log = open(os.path.join(self.log_dir, f"{name}.log"), "ab")
        proc = subprocess.Popen(
            ["taskset", "-c", str(cpu)] + cmd,
            stdout=subprocess.PIPE if stdout_pipe else log, stderr=log,
            start_new_session=True, text=stdout_pipe or None)
        log.close()
        proc.bench_name = name
        self.procs.append(proc)
        return proc

    def expect_line(self, proc, wanted, timeout=20.0):
        """Waits for `proc`'s first stdout line and checks it starts with `wanted`."""
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith(wanted):
            raise RuntimeError(f"{proc.bench_name}: expected '{wanted}...' on stdout, got "
                               f"{line or 'nothing'!r} (see {self.log_dir}/{proc.bench_name}.log)")
        return line

    def check_alive(self):
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.bench_name} exited with {p.returncode} "
                                   f"(see {self.log_dir}/{p.bench_name}.log)")

    def close(self):
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        self.procs.clear()


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def only_child(pid, timeout=10.0):
    """The single child of `pid` (NGINX's worker under its master)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True,
                             check=False).stdout
        pids = [int(p) for p in out.split()]
        if len(pids) == 1:
            return pids[0]
        time.sleep(0.05)
    raise RuntimeError(f"process {pid} has no single worker child")


@dataclass
class ProcSample:
    cpu_s: float  # user + system, every thread
    voluntary: int  # context switches summed over threads: waiting (epoll_wait, a lock)
    involuntary: int  # and preempted (the scheduler took the CPU away)
    rss_kib: int

    @property
    def ctx_switches(self):
        return self.voluntary + self.involuntary


def peak_rss_kib(pid):
    """The process's peak resident set (VmHWM) in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def sample_proc(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    rss = int(fields[21]) * PAGE_KIB
    switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in switches:
                        switches[key] += int(value)
        except FileNotFoundError:  # a thread that just ended
            pass
    return ProcSample(cpu, switches["voluntary_ctxt_switches"],
                      switches["nonvoluntary_ctxt_switches"], rss)


def cpu_times(cpu):
    """(busy, total) jiffies of one CPU, from /proc/stat."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]
                return sum(v) - idle, sum(v)
    raise RuntimeError(f"cpu{cpu} not in /proc/stat")


def tcp_active_opens():
    """The machine's TcpActiveOpens counter (connect()s that reached SYN-SENT)."""
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("ActiveOpens")])


def time_wait(port):
    """TIME_WAIT sockets on loopback involving `port`: (on the side that listens on `port`,
    on the side that connected to it)."""
    out = subprocess.run(["ss", "-Htan", "state", "time-wait"], capture_output=True,
                         text=True, check=True).stdout
    listening = connecting = 0
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4:
            continue
        local, peer = (c.rsplit(":", 1)[1] for c in cols[-2:])
        listening += local == str(port)
        connecting += peer == str(port)
    return listening, connecting


def established(port):
    """Established TCP connections to `port` (counted once, from the connecting side)."""
    out = subprocess.run(["ss", "-Htan", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return len(out.splitlines())
