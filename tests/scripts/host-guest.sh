#!/bin/sh
# rig_host's guest command for VM $VM: marks itself ready and waits for L1's `go` on its console
# (sent once every VM of the boot is ready: host-probe-begin.sh), so that the VMs' loads start
# at set times however far apart the guests booted; then, $START_SECS after it, one busy thread
# on vCPU $BUSY_VCPU for $LOAD_SECS, between marks.
echo "pvmm-mark: ready-$VM"
# At most $GO_WAIT_SECS: a VM whose guest crashed in its boot never marks itself ready, and
# the others then go on alone (the crash is the boot's rig failure, booted again).
# busybox sh has read -t.
# shellcheck disable=SC3045
read -r -t "$GO_WAIT_SECS" _ < /dev/ttyS0
sleep "$START_SECS"
echo "pvmm-mark: load-begin-$VM"
taskset -c "$BUSY_VCPU" pvmm-load --threads 1 --duty 100 --seconds "$LOAD_SECS"
echo "pvmm-mark: load-end-$VM"
