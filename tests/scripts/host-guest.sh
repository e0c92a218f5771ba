#!/bin/sh
# rig_host's guest command for VM $VM: idle $LEAD_SECS, then one busy thread on vCPU $BUSY_VCPU
# for $LOAD_SECS, between marks.
sleep "$LEAD_SECS"
echo "pvmm-mark: load-begin-$VM"
taskset -c "$BUSY_VCPU" pvmm-load --threads 1 --duty 100 --seconds "$LOAD_SECS"
echo "pvmm-mark: load-end-$VM"
