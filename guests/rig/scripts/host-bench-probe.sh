#!/bin/sh
# The host-wide benchmark's L1 probe, one per VM (busybox sh), after cpu-activity.sh. The first
# to start is the leader: it starts the daemon when $START_DAEMON is 1, prints the topology and
# samples /proc/stat every $SAMPLE_INTERVAL seconds. Every $MIGRATION_EVERY samples each probe
# prints `N <uptime> <migrations> <VMM CPU ticks> <vCPU CPU ticks>` for its own VM $PVMM_PID,
# and the leader `D <uptime> <daemon CPU ticks>` (a VM's vCPU threads exit before its process:
# the parser ends its samples there). After every VM has ended the leader prints the guests'
# marks and stops the daemon.
taskset -p 1 $$ >/dev/null 2>&1
mkdir -p /tmp/bench-live && : > "/tmp/bench-live/$PVMM_PID"
leader=
if mkdir /tmp/bench-leader 2>/dev/null; then
    leader=1
    if [ "$START_DAEMON" = 1 ]; then
        /bin/pvmm host --runtime-dir "$RUNTIME_DIR" --adopt auto --tick-ms 100 \
            > /tmp/pvmm-host.log 2>&1 &
        echo $! > /tmp/pvmm-host.pid
    fi
    print_topology
fi
out=/tmp/bench-samples-$PVMM_PID
: > "$out"
n=0
while kill -0 "$PVMM_PID" 2>/dev/null; do
    if [ -n "$leader" ]; then
        sample_cpus "$out"
    fi
    n=$((n + 1))
    if [ $((n % MIGRATION_EVERY)) = 0 ]; then
        files=
        stats=
        for t in /proc/"$PVMM_PID"/task/*; do
            { read -r c < "$t/comm"; } 2>/dev/null
            case "$c" in vcpu* | "CPU "*/KVM) files="$files $t/sched" stats="$stats $t/stat" ;; esac
        done
        read -r up _ < /proc/uptime
        # $files and $stats are lists of paths without spaces: split on purpose.
        # shellcheck disable=SC2086
        mig=$(cat $files 2>/dev/null | awk '/nr_migrations/ {s += $NF} END {print s + 0}')
        # shellcheck disable=SC2086
        cpu=$(cat /proc/"$PVMM_PID"/stat $stats 2>/dev/null \
            | awk '{sub(/^.*\) /, ""); t = $12 + $13; if (NR == 1) all = t; else v += t} END {print all + 0, v + 0}')
        echo "N $up $mig $cpu" >> "$out"
        if [ -n "$leader" ] && [ -f /tmp/pvmm-host.pid ]; then
            echo "D $up $(awk '{sub(/^.*\) /, ""); print $12 + $13}' "/proc/$(cat /tmp/pvmm-host.pid)/stat" 2>/dev/null)" >> "$out"
        fi
    fi
    sleep "$SAMPLE_INTERVAL"
done
cat "$out"
rm -f "/tmp/bench-live/$PVMM_PID"
if [ -n "$leader" ]; then
    while [ -n "$(ls /tmp/bench-live)" ]; do sleep 1; done
    sleep 1
    [ -f /tmp/rig-marks ] && sed 's/^/M /' /tmp/rig-marks
    [ -f /tmp/pvmm-host.pid ] && kill "$(cat /tmp/pvmm-host.pid)" 2>/dev/null
fi
