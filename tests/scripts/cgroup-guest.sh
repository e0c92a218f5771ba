#!/bin/sh
# rig_cgroup's guest command: every vCPU busy for $LOAD_SECS, after the mark `busy`.
echo "pvmm-mark: busy"
pvmm-load --threads "$(nproc)" --duty 100 --seconds "$LOAD_SECS" > /dev/null
