#!/bin/sh
# bench-io's L1 side, beside each VM in turn: takes the guest's BYTES on port 5001, and once the
# guest says it listens (its mark carries its address) sends it BYTES of zeros, timed on L1's
# clock: `IO net-rx <uptime before> <uptime after>`.
alive() { kill -0 "$PVMM_PID" 2> /dev/null; }
mkfifo "/tmp/io-out-$RIG_LABEL"
nc -l -p 5001 <> "/tmp/io-out-$RIG_LABEL" > /dev/null &
until grep -qs io-listening /tmp/rig-marks || ! alive; do sleep 0.2; done
guest=$(sed -n 's/.* io-listening //p' /tmp/rig-marks)
# The next VM's guest must not find this one's mark.
: > /tmp/rig-marks
read -r a _ < /proc/uptime
head -c "$BYTES" /dev/zero | nc "$guest" 5002 || echo "IO error net-rx"
read -r b _ < /proc/uptime
echo "IO net-rx $a $b"
while alive; do sleep 0.2; done
wait
