#!/bin/sh
# rig_host's rise-and-fall guest command: marks itself ready and waits for L1's `go` on its
# console (host-probe-begin.sh: the daemon has been running since pvmm started), four busy
# threads for $RISE_SECS, then idle $FALL_SECS, between marks.
echo "pvmm-mark: ready-0"
# At most $GO_WAIT_SECS: a VM whose guest crashed in its boot never marks itself ready, and
# the others then go on alone (the crash is the boot's rig failure, booted again).
# busybox sh has read -t.
# shellcheck disable=SC3045
read -r -t "$GO_WAIT_SECS" _ < /dev/ttyS0
echo pvmm-mark: rise
pvmm-load --threads 4 --duty 100 --seconds "$RISE_SECS"
echo pvmm-mark: fall
sleep "$FALL_SECS"
echo "pvmm-mark: done"
