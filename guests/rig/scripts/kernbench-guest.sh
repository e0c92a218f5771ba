#!/bin/sh
# bench-kernbench's guest: mounts the kernbench disk /dev/vda read-only at /kb, a tmpfs on its
# /tmp for the build, and, with WARM=1, reads the toolchain once so that every case builds from
# a warm page cache. Settles SETTLE_SECS, builds the tree TREE with `make -jJOBS` (MYCFLAGS appended to the
# tree's own CFLAGS) between the marks
# load-beginMARK and load-endMARK (then `KB built <uptime before> <uptime after>` when the
# result runs, `KB error <step>` when a step fails), and idles IDLE_TAIL_SECS.
kb=/kb
fail() {
    echo "KB error $1"
    exit 1
}
mkdir -p $kb
polls=0
while [ ! -b /dev/vda ] && [ $polls -lt 50 ]; do
    sleep 0.2
    polls=$((polls + 1))
done
mount -t ext4 -o ro /dev/vda $kb || fail mount
mount -t tmpfs -o size=256m tmpfs $kb/tmp || fail tmpfs
mount -t proc proc $kb/proc || fail proc
mount -t devtmpfs devtmpfs $kb/dev || fail dev
if [ "$WARM" = 1 ]; then
    find $kb/usr/bin $kb/usr/lib/gcc $kb/usr/include $kb/usr/lib/x86_64-linux-gnu -type f \
        -exec cat {} + > /dev/null
fi
cp -a "$kb/usr/src/$TREE" $kb/tmp/build || fail copy
sleep "$SETTLE_SECS"
read -r a _ < /proc/uptime
echo "pvmm-mark: load-begin$MARK"
chroot $kb make -C /tmp/build/src -j"$JOBS" posix MYCFLAGS="$MYCFLAGS" > /tmp/kb-make.log 2>&1
status=$?
echo "pvmm-mark: load-end$MARK"
read -r b _ < /proc/uptime
[ $status = 0 ] || { tail -5 /tmp/kb-make.log; fail make; }
chroot $kb /tmp/build/src/lua -e 'print("KB lua " .. _VERSION)' || fail run
echo "KB built $a $b"
sleep "$IDLE_TAIL_SECS"
echo "pvmm-mark: idle-end$MARK"
