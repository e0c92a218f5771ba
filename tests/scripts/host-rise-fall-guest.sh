#!/bin/sh
# rig_host's rise-and-fall guest command: idle $LEAD_SECS, four busy threads for $RISE_SECS,
# then idle $FALL_SECS, between marks.
sleep "$LEAD_SECS"
echo pvmm-mark: rise
pvmm-load --threads 4 --duty 100 --seconds "$RISE_SECS"
echo pvmm-mark: fall
sleep "$FALL_SECS"
echo "pvmm-mark: done"
