#!/bin/sh
# rig_api's guest command, after guest-helpers.sh: announces readiness, waits (up to 2 min)
# until vCPU 0's highest_perf is the outside capacity $EXTERNAL_PERF and reads all, asks the
# balancer to stop, waits until it changes and reads again, then idles $IDLE_SECS.

# w OP: waits until vCPU 0's highest_perf OP $EXTERNAL_PERF holds; false after 2 min.
w() {
    i=0
    while [ $i -lt 240 ]; do
        v=$(cat /sys/devices/system/cpu/cpu0/acpi_cppc/highest_perf)
        test "$v" "$1" "$EXTERNAL_PERF" && return 0
        sleep 0.5
        i=$((i + 1))
    done
    return 1
}
echo pvmm-mark: api-ready
w '='
r ext
echo pvmm-mark: api-release
w '!='
r own
echo pvmm-mark: idle-begin
sleep "$IDLE_SECS"
echo pvmm-mark: idle-end
