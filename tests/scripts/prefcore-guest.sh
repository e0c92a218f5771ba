#!/bin/sh
# rig_prefcore's guest command, after guest-helpers.sh: amd-pstate's state, then the guest's
# core ranking and highest_perf every $READ_INTERVAL_S for $READ_FOR_S seconds.

# rd N: the mark `pvmm-mark: rank-N`, then `RANK N <ranking per CPU> HP <highest_perf per
# CPU>` from the guest's sysfs. The shell's own `read` takes the values, so a read starts no
# process: under a loaded host each process the guest starts costs it most of a second.
rd() {
    echo "pvmm-mark: rank-$1"
    c=/sys/devices/system/cpu
    k=
    h=
    for f in "$c"/cpu[0-9]*/cpufreq/amd_pstate_prefcore_ranking; do
        read -r v < "$f"
        k="$k$v "
    done
    for f in "$c"/cpu[0-9]*/acpi_cppc/highest_perf; do
        read -r v < "$f"
        h="$h$v "
    done
    echo "RANK $1 ${k}HP $h"
}
echo "PREF status $(cat /sys/devices/system/cpu/amd_pstate/status) prefcore $(cat /sys/devices/system/cpu/amd_pstate/prefcore) itmt $(cat /proc/sys/kernel/sched_itmt_enabled)"
sleep 3
rd 0
echo pvmm-mark: patterns
i=0
read -r up _ < /proc/uptime
end=$((${up%.*} + READ_FOR_S))
while read -r up _ < /proc/uptime && [ "${up%.*}" -lt $end ]; do
    sleep "$READ_INTERVAL_S"
    i=$((i + 1))
    rd $i
done
