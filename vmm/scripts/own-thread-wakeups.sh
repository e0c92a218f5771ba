#!/usr/bin/env bash
# Wake-ups and CPU time per second of pvmm's own (non-vCPU) threads with an idle guest of
# $VCPUS vCPUs (default 4): a tiny PVH guest that halts forever, run on this machine's /dev/kvm.
# pvmm-sched's CPU ms per second over 10 is its cost per 100 ms tick. Needs GNU as/ld.
#   [VCPUS=N] vmm/scripts/own-thread-wakeups.sh SECONDS [PVMM ARGS...]
#   e.g. vmm/scripts/own-thread-wakeups.sh 20 --tick-ms 1000; VCPUS=255 ... 20
# Prints, per thread, voluntary+involuntary context switches per second (/proc/.../status) and
# CPU ms per second (schedstat run time); then pvmm's `-v` line of the scheduler's CPU time per
# tick by phase (over the whole run, its first tick included).
set -euo pipefail
secs=${1:?usage: own-thread-wakeups.sh SECONDS [PVMM ARGS...]}; shift
cd "$(dirname "$0")/../.."
cargo build -q --release -p pvmm
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
vmm/scripts/halt-guest.sh "$dir"
./target/release/pvmm -v --vcpus "${VCPUS:-4}" --memory 64 --api-socket "$dir/s.sock" "$@" \
    "$dir/halt.elf" </dev/null >/dev/null 2>"$dir/err" &
pid=$!
sleep 3
vcpus=$(./target/release/pvmm ctl --socket "$dir/s.sock" --json vcpus |
    python3 -c 'import json,sys; print(" ".join(str(v["tid"]) for v in json.load(sys.stdin)["vcpus"]))')
snap() {
    for t in /proc/$pid/task/*; do
        tid=${t##*/}
        case " $vcpus " in *" $tid "*) continue ;; esac
        echo "$tid $(cat "$t/comm" | tr ' ' _) $(awk '/voluntary_ctxt_switches/{s+=$2} END{print s}' "$t/status") $(awk '{print $1}' "$t/schedstat")"
    done | sort
}
snap > "$dir/a"; sleep "$secs"; snap > "$dir/b"
kill "$pid"; wait "$pid" 2>/dev/null || true
join "$dir/a" "$dir/b" | awk -v s="$secs" \
    '{printf "%-16s wakeups/s %6.1f  cpu ms/s %7.3f\n", $2, ($6-$3)/s, ($7-$4)/s/1e6}'
grep -h 'scheduler tick:' "$dir/err" || true
