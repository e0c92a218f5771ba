#!/bin/sh
# rig_asym_packing's guest command, after guest-helpers.sh: a busy thread on vCPU
# $CONFINED_VCPU under pvmm's own placement for $OWN_PHASE_S, then under the outside balancer:
# after $SETTLE_S the guest's core ranking, then $CONFINED_SAMPLES reads of where the confined
# busy thread runs, $SAMPLE_S apart, then the thread let go to all CPUs and $RELEASED_SAMPLES
# reads more.

# w LABEL: the mark `pvmm-mark: asym-LABEL`, then `ASYM LABEL <CPU>`: the CPU the busy thread
# ($P, thread $T) last ran on, read with shell builtins so that the reads start no processes of
# their own to disturb the guest's balancing.
w() {
    echo "pvmm-mark: asym-$1"
    read -r x < "/proc/$P/task/$T/stat"
    # The stat line's fields become the positional parameters: split on purpose.
    # shellcheck disable=SC2086
    set -- "$1" $x
    echo "ASYM $1 ${40}"
}
sleep 2
echo pvmm-mark: asym-own
l "$CONFINED_VCPU" "$OWN_PHASE_S"
wait
echo pvmm-mark: asym-external
sleep "$SETTLE_S"
echo "RANKING $(cat /sys/devices/system/cpu/cpu[0-9]*/cpufreq/amd_pstate_prefcore_ranking 2>/dev/null | tr '\n' ' ')"
l "$CONFINED_VCPU" 30
P=$!
T=
n=0
while [ -z "$T" ] && [ $n -lt "$THREAD_WAIT_POLLS" ]; do
    sleep 0.1
    n=$((n + 1))
    for t in /proc/"$P"/task/*; do
        read -r c < "$t/comm"
        [ "$c" = load0 ] && T=${t##*/}
    done
done
i=0
while [ $i -lt "$CONFINED_SAMPLES" ]; do
    i=$((i + 1))
    w c$i
    sleep "$SAMPLE_S"
done
echo pvmm-mark: asym-release
taskset -a -p -c 0-3 "$P" >/dev/null
i=0
while [ $i -lt "$RELEASED_SAMPLES" ]; do
    sleep "$SAMPLE_S"
    i=$((i + 1))
    w r$i
done
kill "$P"
wait
