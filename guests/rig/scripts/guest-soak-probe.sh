#!/bin/sh
# The guest soak's L1 probe (busybox sh). Once the VMM $PVMM_PID has exited, prints L1's levels
# on one line (`$STATE_TAG MemAvailable SUnreclaim processes threads files VMs tmp-entries`),
# then the $SLAB_TOP slab caches that grew most since the first run (`$SLAB_TAG name:KiB ...`,
# from /proc/slabinfo: active objects times object size), keeping its state in $PROBE_DIR.
# debugfs is mounted if it is not, for KVM's per-VM directories.
mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug 2>/dev/null
mkdir -p "$PROBE_DIR"
while kill -0 "$PVMM_PID" 2>/dev/null; do sleep 0.2; done
sleep 1
# Two numbers: split on purpose.
# shellcheck disable=SC2046
set -- $(awk '/^MemAvailable:/ {a=$2} /^SUnreclaim:/ {s=$2} END {print a, s}' /proc/meminfo)
# /proc's entries are numbers: ls is safe here.
# shellcheck disable=SC2012
procs=$(ls -d /proc/[0-9]* | wc -l)
threads=$(cut -d' ' -f4 /proc/loadavg | cut -d/ -f2)
# shellcheck disable=SC2012
files=$(for d in /proc/[0-9]*/fd; do ls "$d"; done 2>/dev/null | wc -l)
# shellcheck disable=SC2010
vms=$(ls /sys/kernel/debug/kvm 2>/dev/null | grep -c '^[0-9]')
# shellcheck disable=SC2010
tmp=$(ls -A /tmp | grep -c -v -e '^rig-run-' -e '^soak-probe$')
echo "$STATE_TAG $1 $2 $procs $threads $files $vms $tmp"
awk 'NR > 2 {print $1, $2 * $4}' /proc/slabinfo > "$PROBE_DIR/slab-now"
[ -f "$PROBE_DIR/slab-first" ] || cp "$PROBE_DIR/slab-now" "$PROBE_DIR/slab-first"
echo "$SLAB_TAG $(awk 'NR == FNR {a[$1] = $2; next} $2 > a[$1] {print $2 - a[$1], $1}' \
    "$PROBE_DIR/slab-first" "$PROBE_DIR/slab-now" | sort -rn | head -"$SLAB_TOP" \
    | awk '{printf "%s:%d ", $2, $1 / 1024}')"
