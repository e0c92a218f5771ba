#!/bin/sh
# rig_hotplug's guest command, after guest-helpers.sh: four busy vCPUs (each for at most
# $LOAD_CAP_SECS) while L1 takes each CPU list of $PHASES offline and back one after another,
# $PHASE_SECS apart, as the guest's `cpus-off`/`cpus-on` marks ask; a phase's worth of load
# after the last mark, then the load is stopped (not timed from its start: on a loaded machine
# the guest's marks drift later than its clock would have them).
for c in 0 1 2 3; do l $c "$LOAD_CAP_SECS"; done
for cpus in $PHASES; do
    for what in off on; do
        sleep "$PHASE_SECS"
        echo "pvmm-mark: cpus-$what $cpus"
    done
done
sleep "$PHASE_SECS"
killall pvmm-load
wait
