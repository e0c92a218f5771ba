#!/bin/sh
# rig_placement's powersaving guest command, after guest-helpers.sh: 4 busy vCPUs for 4-5 s,
# idle for 9 s, vCPU 3 busy alone for 3 s, 1 s idle, vCPUs 2 and 3 busy for 4-5 s.
e 5
for c in 0 1 2 3; do u $c; done
wait
sleep 9
l 3 3
wait
sleep 1
e 5
u 2
u 3
wait
