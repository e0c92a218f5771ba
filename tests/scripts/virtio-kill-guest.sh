#!/bin/sh
# rig_virtio's second guest: writes DATA to its root disk, syncs (the kernel flushes the disk),
# says so and waits for L1 to kill its pvmm with SIGKILL.
echo "$DATA" > /root/flushed
sync
echo "pvmm-mark: flushed"
sleep 600
