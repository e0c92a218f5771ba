#!/bin/sh
# rig_boot's L1 probe that fakes a soft lockup: writes the kernel's soft-lockup line, stuck
# for $STUCK seconds, to L1's kernel log, then waits for the rig to end the run.
sleep 1
echo "<2>watchdog: BUG: soft lockup - CPU#1 stuck for ${STUCK}s! [vcpu0:1]" > /dev/kmsg
sleep 1000
