#!/bin/sh
# rig_virtio's first guest (root disk, read-only second disk, tap network, entropy): reports
# what it sees, tries to write the read-only disk twice (through the kernel, then past its
# read-only flag), moves BYTES each way over TCP with L1 (GW), writes DATA to its root disk and
# remounts it read-only before init powers off.
echo "ROOT $(grep ' / ' /proc/mounts | cut -d' ' -f1,3)"
echo "RNG $(cat /sys/class/misc/hw_random/rng_current) $(head -c 64 /dev/hwrng | wc -c)"
echo "RO $(blockdev --getro /dev/vdb) $(blockdev --getsize64 /dev/vdb)"
dd if=/dev/zero of=/dev/vdb count=1 conv=fsync 2> /dev/null && echo "RO kernel-write done"
blockdev --setrw /dev/vdb
dd if=/dev/zero of=/dev/vdb bs=4k count=1 oflag=direct 2> /dev/null && echo "RO device-write done"
echo "RO sum $(md5sum < /dev/vdb)"
ping -c 3 "$GW" | grep loss | sed 's/^/PING /'
mkfifo /tmp/f /tmp/g
md5sum < /tmp/f > /tmp/tx &
head -c "$BYTES" /dev/urandom | tee /tmp/f | nc "$GW" 5001
wait
echo "NET tx $(cat /tmp/tx)"
nc -l -p 5002 <> /tmp/g | md5sum > /tmp/rx &
sleep 2
echo "pvmm-mark: listening"
wait
echo "NET rx $(cat /tmp/rx)"
echo "$DATA" > /root/written
sync
mount -o remount,ro /
echo "DISK written $?"
