#!/bin/sh
# rig_cppc's shared-CPU guest command, after guest-helpers.sh: four busy vCPUs, each CPU's
# feedback_ctrs read 2 s and 6 s into the load.

# f LABEL: the mark `pvmm-mark: fb-LABEL`, then `FB LABEL CPU <feedback_ctrs>` per CPU.
f() {
    echo "pvmm-mark: fb-$1"
    for c in 0 1 2 3; do
        read -r x < /sys/devices/system/cpu/cpu$c/acpi_cppc/feedback_ctrs
        echo "FB $1 $c $x"
    done
}
for c in 0 1 2 3; do l $c 8; done
sleep 2
f a
sleep 4
f b
wait
