#!/bin/sh
# rig_placement's guest command for the other policies, after guest-helpers.sh: vCPUs 2 and 3
# busy for 4-5 s, 1 s idle, all 4 busy for 4-5 s.
e 5
u 2
u 3
wait
sleep 1
e 5
for c in 0 1 2 3; do u $c; done
wait
