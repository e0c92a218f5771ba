#!/bin/sh
# The placement benchmark's guest command (busybox sh in the guest): settles for $SETTLE_SECS,
# then runs $THREADS pvmm-load threads at $DUTY percent of each $PERIOD_MS for $SECONDS_LOAD
# seconds (with no thread, sleeps as long), then idles for $IDLE_TAIL_SECS; `pvmm-mark:` lines
# tell L1 when each phase begins.
sleep "$SETTLE_SECS"
echo pvmm-mark: load-begin
if [ "$THREADS" -gt 0 ]; then
    pvmm-load --threads "$THREADS" --duty "$DUTY" --period-ms "$PERIOD_MS" --seconds "$SECONDS_LOAD"
else
    sleep "$SECONDS_LOAD"
fi
echo pvmm-mark: load-end
sleep "$IDLE_TAIL_SECS"
echo pvmm-mark: idle-end
