#!/bin/bash
# Interleaved: the prototype fast path vs sluice (static), same backend, same wrk.
B=/work/main/target/release
taskset -c 0 $B/bench-backend --body-bytes 1024 --listen 127.0.0.1:18081 > backend.log 2>&1 &
BK=$!
sleep 0.5
cpu() { awk '{print $14, $15}' /proc/$1/stat; }
for round in 1 2 3; do
  for t in proto sluice; do
    if [ $t = proto ]; then taskset -c 1 /tmp/proto/target/release/proto 127.0.0.1:18080 127.0.0.1:18081 & P=$!
    else taskset -c 1 $B/sluice run -c s.toml > sluice.log 2>&1 & P=$!; fi
    sleep 0.7
    taskset -c 0 wrk -t1 -c64 -d2s http://127.0.0.1:18080/ > /dev/null
    read u0 s0 < <(cpu $P)
    out=$(taskset -c 0 wrk -t1 -c64 -d8s http://127.0.0.1:18080/)
    read u1 s1 < <(cpu $P)
    req=$(echo "$out" | awk '/requests in/ {print $1}')
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    err=$(echo "$out" | grep -c "Non-2xx\|Socket errors")
    echo "$round $t rps=$rps user_us=$(echo "($u1-$u0)*10000/$req" | bc -l | cut -c1-5) sys_us=$(echo "($s1-$s0)*10000/$req" | bc -l | cut -c1-5) errlines=$err"
    kill $P; wait $P 2>/dev/null
  done
done
kill $BK
