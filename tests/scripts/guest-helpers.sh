#!/bin/sh
# Shell functions the rig tests' guest commands start with (busybox sh in the guest). Sourced:
# defines the functions only.

# l CPU SECS: one busy pvmm-load thread on guest CPU CPU for SECS seconds, in the background.
l() { taskset -c "$1" pvmm-load --threads 1 --duty 100 --seconds "$2" >/dev/null & }

# e SECS: sets $E, the guest uptime SECS seconds from now (for u).
e() {
    read -r t _ < /proc/uptime
    E=$((${t%.*} + $1))
}

# u CPU: one busy pvmm-load thread on guest CPU CPU until uptime $E, in the background, so that
# the threads of a phase end together.
u() { taskset -c "$1" pvmm-load --threads 1 --duty 100 --until-uptime "$E" >/dev/null & }

# r LABEL: the mark `pvmm-mark: cppc-LABEL`, then `CPPC LABEL <highest_perf per CPU> GED <GED
# interrupts so far>`.
r() {
    echo "pvmm-mark: cppc-$1"
    echo "CPPC $1 $(cat /sys/devices/system/cpu/cpu[0-9]*/acpi_cppc/highest_perf | tr '\n' ' ')GED $(grep Ged /proc/interrupts | awk '{s=0; for(i=2;i<=NF;i++) if ($i ~ /^[0-9]+$/) s+=$i; print s}')"
}
