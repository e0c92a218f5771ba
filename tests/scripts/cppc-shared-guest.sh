#!/bin/sh
# rig_cppc's shared-CPU guest command, after guest-helpers.sh: four busy vCPUs for 12 s, each
# CPU's feedback_ctrs read 2 s and 6 s into the load. The load outlasts the second read by 6 s:
# L1 timestamps the marks as they pass its console, seconds late when L1 is loaded, and the
# window between them must not reach the load's end, where the vCPUs are placed afresh.

# f LABEL: the mark `pvmm-mark: fb-LABEL`, then `FB LABEL CPU <feedback_ctrs>` per CPU.
f() {
    echo "pvmm-mark: fb-$1"
    for c in 0 1 2 3; do
        read -r x < /sys/devices/system/cpu/cpu$c/acpi_cppc/feedback_ctrs
        echo "FB $1 $c $x"
    done
}
for c in 0 1 2 3; do l $c 12; done
sleep 2
f a
sleep 4
f b
wait
