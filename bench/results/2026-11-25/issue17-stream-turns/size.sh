#!/bin/bash
# usage: size.sh <label> <sluice-binary> [env...]  -> prints MB/s, proxy cpu ms per MiB, IPIs per MiB
set -u
label=$1; bin=$2; shift 2
bytes=${BYTES:-1048576}
dir=$(mktemp -d)
up=$((20000 + RANDOM % 10000)); port=$((up+1)); admin=$((up+2))
if [ -z "${REVERSE:-}" ]; then
taskset -c 0 "$(git rev-parse --show-toplevel)"/target/release/bench-backend --listen 127.0.0.1:$up --body-bytes $bytes >/dev/null 2>&1 & bpid=$!
fi
cat > $dir/s.toml <<T
[runtime]
workers = 1
[admin]
listen = "127.0.0.1:$admin"
[[listener]]
name = "bench"
listen = "127.0.0.1:$port"
[[route]]
cluster = "svc"
T
if [ -z "${REVERSE:-}" ]; then cat >> $dir/s.toml <<T
[cluster.svc]
kind = "static"
endpoints = ["127.0.0.1:$up"]
pool = { max_idle_per_endpoint = 256 }
T
else cat >> $dir/s.toml <<T
[acceptor]
listen = "127.0.0.1:$up"
handshakes_per_second = 0
[cluster.svc]
kind = "reverse"
queue_max = 4096
queue_timeout = "10s"
T
fi
env "$@" taskset -c 1 $bin run -c $dir/s.toml >/dev/null 2>&1 & spid=$!
for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
if [ -n "${REVERSE:-}" ]; then taskset -c 0 "$(git rev-parse --show-toplevel)"/target/release/bench-backend --acceptor 127.0.0.1:$up --service svc --sessions 64 --body-bytes $bytes >/dev/null 2>&1 & bpid=$!; sleep 1; fi
taskset -c 0 wrk -c16 -t1 -d1 http://127.0.0.1:$port/ >/dev/null
cpu0=$(awk '{print $14+$15}' /proc/$spid/stat)
st0=$(awk '/^cpu0 /{print $2+$3+$4+$7+$8, $5+$6} /^cpu1 /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat | tr "\n" " ")
res0=$(awk '/RES:/{print $2+$3} /CAL:/{c=$2+$3} END{}' /proc/interrupts); cal0=$(awk '/CAL:/{print $2+$3}' /proc/interrupts)
out=$(taskset -c 0 wrk -c16 -t1 -d${SECS:-5} http://127.0.0.1:$port/)
cpu1=$(awk '{print $14+$15}' /proc/$spid/stat)
st1=$(awk '/^cpu0 /{print $2+$3+$4+$7+$8, $5+$6} /^cpu1 /{print $2+$3+$4+$7+$8, $5+$6}' /proc/stat | tr "\n" " ")
res1=$(awk '/RES:/{print $2+$3}' /proc/interrupts); cal1=$(awk '/CAL:/{print $2+$3}' /proc/interrupts)
reqs=$(echo "$out" | awk '/requests in/{print $1}')
mib=$(python3 -c "print($reqs*$bytes/1048576)")
python3 -c "
reqs=$reqs; mib=$mib; cpu=($cpu1-$cpu0)*10
a=[int(x) for x in '$st0'.split()]; b=[int(x) for x in '$st1'.split()]
d=[y-x for x,y in zip(a,b)]
busy0=d[0]/(d[0]+d[1]); busy1=d[2]/(d[2]+d[3])
print(f'$label cpu0={busy0:.0%} cpu1={busy1:.0%} all_ms/MiB={(d[0]+d[2])*10/mib:.3f} ', end='')
print(f'$label MB/s={mib*1.048576/${SECS:-5}:.0f} cpu_ms/MiB={cpu/mib:.3f} RES/MiB={($res1-$res0)/mib:.2f} CAL/MiB={($cal1-$cal0)/mib:.2f}')"
kill $spid $bpid; wait 2>/dev/null; rm -rf $dir
