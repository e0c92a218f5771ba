#!/usr/bin/env bash
# What joining pvmm-host costs idle VMs: N pvmm VMs of 2 vCPUs whose tiny guest halts forever
# (this machine's /dev/kvm), their CPU over SECONDS on their own, then joined to the daemon
# (`pvmm host`), with the daemon's; utime+stime from /proc/<pid>/stat, in % of one CPU. Each
# PVMM binary given is measured in turn (e.g. two builds side by side in one run); default:
# this tree's release build.
#   vmm/scripts/joined-cost.sh N SECONDS [PVMM...]
set -euo pipefail
n=${1:?usage: joined-cost.sh N SECONDS [PVMM...]}; secs=${2:?usage: joined-cost.sh N SECONDS [PVMM...]}
shift 2
cd "$(dirname "$0")/../.."
if [ $# = 0 ]; then
    cargo build -q --release -p pvmm
    set -- ./target/release/pvmm
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
vmm/scripts/halt-guest.sh "$work"
hz=$(getconf CLK_TCK)
# ticks PID...: the processes' utime+stime so far, in clock ticks.
ticks() {
    local sum=0 f
    for p in "$@"; do
        read -r -a f < "/proc/$p/stat" && sum=$((sum + f[13] + f[14]))
    done
    echo "$sum"
}
# share FROM TO: ticks over SECONDS as "x.yz %" of one CPU.
share() {
    local c=$(( ($2 - $1) * 10000 / hz / secs ))
    printf '%d.%02d %%' $((c / 100)) $((c % 100))
}
for pvmm in "$@"; do
    dir=$(mktemp -d "$work/run.XXXX")
    pids=()
    for i in $(seq 1 "$n"); do
        "$pvmm" --vcpus 2 --memory 64 --api-socket "$dir/vm$i.sock" "$work/halt.elf" \
            </dev/null >/dev/null 2>&1 &
        pids+=($!)
    done
    sleep 5
    a=$(ticks "${pids[@]}"); sleep "$secs"; b=$(ticks "${pids[@]}")
    alone=$(share "$a" "$b")
    "$pvmm" host -v --runtime-dir "$dir" >"$dir/host.log" 2>&1 &
    host=$!
    sleep 5
    a=$(ticks "${pids[@]}"); ha=$(ticks "$host"); sleep "$secs"
    b=$(ticks "${pids[@]}"); hb=$(ticks "$host")
    echo "$pvmm: $n VMs alone $alone, joined $(share "$a" "$b") + daemon $(share "$ha" "$hb")" \
        "($(grep -c 'joined pvmm VM' "$dir/host.log") joined)"
    kill "$host" "${pids[@]}"
    wait 2>/dev/null || true
done
