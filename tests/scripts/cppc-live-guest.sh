#!/bin/sh
# rig_cppc's live-capacity guest command, after guest-helpers.sh: reads idle, with vCPUs 2 and
# 3 busy, with all four busy, then after 8 s idle.
r boot
l 2 5
l 3 5
sleep 3
r two
wait
for c in 0 1 2 3; do l $c 4; done
sleep 2
r four
wait
sleep 8
r end
