#!/bin/sh
# bench-io's guest, the same under every VMM: on the scratch disk /dev/vdb, a sequential write
# and a sequential read of MIB MiB with O_DIRECT and random 4 KiB reads for SECS seconds; then
# BYTES of zeros to L1 (GW) over TCP, and BYTES back once L1 sees its mark. Prints
# `IO STEP <uptime before> <uptime after>` per timed step and pvmm-load's read count.
up() {
    read -r now _ < /proc/uptime
    echo "$now"
}
a=$(up)
dd if=/dev/zero of=/dev/vdb bs=1M count="$MIB" oflag=direct 2> /dev/null || echo "IO error seq-write"
echo "IO seq-write $a $(up)"
a=$(up)
dd if=/dev/vdb of=/dev/null bs=1M count="$MIB" iflag=direct 2> /dev/null || echo "IO error seq-read"
echo "IO seq-read $a $(up)"
pvmm-load --random-reads /dev/vdb --seconds "$SECS" | sed -n 's/^pvmm-load: random-reads /IO random-reads /p'
a=$(up)
head -c "$BYTES" /dev/zero | nc "$GW" 5001 || echo "IO error net-tx"
echo "IO net-tx $a $(up)"
mkfifo /tmp/io-in
nc -l -p 5002 <> /tmp/io-in > /dev/null &
sleep 2
echo "pvmm-mark: io-listening $(ip -4 addr show eth0 | sed -n 's/.*inet \([0-9.]*\).*/\1/p')"
wait
