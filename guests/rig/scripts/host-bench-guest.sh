#!/bin/sh
# The host-wide benchmark's guest command for VM $VM (busybox sh in the guest): idle for
# $LEAD_SECS, then pvmm-load at $DUTY percent of each $PERIOD_MS for $SECONDS_LOAD seconds,
# its progress (iterations so far) each second through a `pvmm-mark:` line that L1 timestamps.
sleep "$LEAD_SECS"
echo "pvmm-mark: load-begin-$VM"
pvmm-load --threads 1 --duty "$DUTY" --period-ms "$PERIOD_MS" --seconds "$SECONDS_LOAD" \
    --progress-ms 1000 | while read -r _ b c; do
    [ "$b" = progress ] && echo "pvmm-mark: work-$VM $c"
done
echo "pvmm-mark: load-end-$VM"
