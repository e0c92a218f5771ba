#!/bin/sh
# L1's CPU activity for the benchmarks' probes (busybox sh). Sourced: defines the functions only.

# print_topology: one `PKG <cpu> <package> <core>` line per L1 CPU, from sysfs.
print_topology() {
    for c in /sys/devices/system/cpu/cpu[0-9]*; do
        read -r pkg < "$c/topology/physical_package_id"
        read -r core < "$c/topology/core_id"
        echo "PKG ${c##*cpu} $pkg $core"
    done
}

# sample_cpus FILE: appends one sample to FILE, `T <L1 uptime>` then `C cpuN <the /proc/stat
# counters>` per CPU, with shell builtins only (no process started per sample).
sample_cpus() {
    read -r up _ < /proc/uptime
    echo "T $up" >> "$1"
    while read -r cpu rest; do
        case $cpu in cpu[0-9]*) echo "C $cpu $rest" >> "$1" ;; esac
    done < /proc/stat
}
