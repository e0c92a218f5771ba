#!/bin/sh
# rig_virtio's L1 side, beside each VM's pvmm (RIG_LABEL says which VM). VM 1: kills pvmm with
# SIGKILL once its guest has flushed, replays the image's journal (as a reboot's fsck would)
# and reads the guest's file back. VM 0: samples every pvmm thread's name and seccomp mode,
# receives the guest's stream on port 5001, sends BYTES to the guest once it listens, and after
# pvmm exits checks the image and reads the guest's file and the read-only image back.
IMAGE=/tmp/rig-root-$RIG_LABEL.ext4
alive() { kill -0 "$PVMM_PID" 2> /dev/null; }
readback() { debugfs -R "cat $1" "$IMAGE" 2> /dev/null | sed 's/^/READ /'; }
if [ "$RIG_LABEL" = 1 ]; then
    until grep -qs flushed /tmp/rig-marks || ! alive; do sleep 0.2; done
    kill -9 "$PVMM_PID"
    while alive; do sleep 0.1; done
    e2fsck -fy "$IMAGE" > /dev/null 2>&1
    echo "FSCK $?"
    readback /root/flushed
    exit 0
fi
(
    while alive; do
        for task in /proc/"$PVMM_PID"/task/*; do
            # A thread that ends between the listing and the reads leaves them empty.
            name=$(cat "$task/comm" 2> /dev/null)
            mode=$(grep Seccomp: "$task/status" 2> /dev/null | cut -f2)
            [ -n "$name" ] && [ -n "$mode" ] && echo "THREAD $name $mode"
        done
        sleep 0.5
    done | sort -u > /tmp/threads
) &
mkfifo /tmp/vf /tmp/vg
nc -l -p 5001 <> /tmp/vg | md5sum > /tmp/vrx &
until grep -qs listening /tmp/rig-marks || ! alive; do sleep 0.2; done
md5sum < /tmp/vf > /tmp/vtx &
head -c "$BYTES" /dev/urandom | tee /tmp/vf | nc "$GUEST" 5002
while alive; do sleep 0.2; done
wait
echo "NET rx $(cat /tmp/vrx)"
echo "NET tx $(cat /tmp/vtx)"
e2fsck -fn "$IMAGE" > /dev/null 2>&1
echo "FSCK $?"
readback /root/written
echo "RO before $(cat /tmp/rig-ro.sum)"
echo "RO after $(md5sum < /tmp/rig-ro.img)"
cat /tmp/threads
