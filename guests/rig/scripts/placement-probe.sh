#!/bin/sh
# The placement tests' L1 probe (busybox sh), after probe-sample.sh. Pins itself to L1 CPU 0,
# prints `START <L1 uptime>` and `PKG <cpu> <package>` per CPU, appends a probe_sample to a
# tmpfs file every $PROBE_INTERVAL seconds while the VMM $PVMM_PID runs, then prints the
# samples, the distinct seccomp (`F`) lines, the guest's marks (`M`) and the VMM's --stats file
# $STATS_PATH whole (the tests read it as the stats schema's type). A probe that runs beside others sets
# $PROBE_OUT (its own sample file) and $KEEP_MARKS (the marks file stays for the others).
taskset -p 1 $$ >/dev/null 2>&1 || echo "probe: cannot pin to CPU 0"
out=${PROBE_OUT:-/tmp/pvmm-samples}
export PROBE_THREADS=/tmp/pvmm-threads
rm -f "$PROBE_THREADS"
read -r up _ < /proc/uptime
echo "START $up" > "$out"
for c in /sys/devices/system/cpu/cpu[0-9]*; do
    read -r pkg < "$c/topology/physical_package_id"
    echo "PKG ${c##*cpu} $pkg" >> "$out"
done
while kill -0 "$PVMM_PID" 2>/dev/null; do
    probe_sample >> "$out"
    sleep "$PROBE_INTERVAL"
done
cat "$out"
[ -f "$PROBE_THREADS" ] && sort -u "$PROBE_THREADS"
rm -f "$PROBE_THREADS"
sleep 1
[ -f /tmp/rig-marks ] && sed 's/^/M /' /tmp/rig-marks
[ -n "$KEEP_MARKS" ] || rm -f /tmp/rig-marks
cat "$STATS_PATH"
