#!/bin/sh
# The placement benchmark's L1 probe (busybox sh), after cpu-activity.sh. Pins itself to CPU
# 0, prints the CPU topology, samples /proc/stat every $SAMPLE_INTERVAL seconds (and every
# $KERNEL_COUNT_EVERY samples the vCPU threads' se.nr_migrations, a `K` line) while the VMM
# $PVMM_PID runs, then prints the samples, the guest's marks and pvmm's --stats file
# $STATS_PATH whole (the benchmark reads its lines as the stats schema's type).
taskset -p 1 $$ >/dev/null 2>&1
print_topology
read -r up _ < /proc/uptime
echo "START $up"
out=/tmp/bench-samples
: > "$out"
n=0
while kill -0 "$PVMM_PID" 2>/dev/null; do
    sample_cpus "$out"
    n=$((n + 1))
    if [ $((n % KERNEL_COUNT_EVERY)) = 0 ]; then
        files=
        for t in /proc/"$PVMM_PID"/task/*; do
            { read -r c < "$t/comm"; } 2>/dev/null
            case "$c" in vcpu*) files="$files $t/sched" ;; esac
        done
        if [ -n "$files" ]; then
            mig=0
            # $files is a list of paths without spaces: split on purpose.
            # shellcheck disable=SC2086
            for m in $(grep -h nr_migrations $files 2>/dev/null | while read -r _ _ v; do echo "$v"; done); do
                mig=$((mig + m))
            done
            # $up: the time of this sample (sample_cpus).
            echo "K $up $mig" >> "$out"
        fi
    fi
    sleep "$SAMPLE_INTERVAL"
done
cat "$out"
sleep 1
[ -f /tmp/rig-marks ] && sed 's/^/M /' /tmp/rig-marks
rm -f /tmp/rig-marks
cat "$STATS_PATH"
rm -f "$STATS_PATH"
