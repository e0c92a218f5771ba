#!/bin/sh
# The rig guest's /init (busybox sh).
# Runs the command given on the kernel command line as pvmm_cmd_b64=<base64 of a shell script>
# or pvmm_cmd="<shell command>", prints its output, and powers off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
read -r uptime _ < /proc/uptime
echo "pvmm-guest: init reached, uptime $uptime"
# From here on the console is the command's: the kernel prints only errors and worse on it
# (console loglevel 4), not the warnings a loaded host brings (clocksource watchdog, slow
# timer interrupts), which would land in the middle of the command's lines. dmesg keeps them.
echo 4 > /proc/sys/kernel/printk
if [ -n "$pvmm_cmd_b64" ]; then
    echo "$pvmm_cmd_b64" | base64 -d > /tmp/pvmm-cmd.sh \
        || echo "pvmm-guest: error: pvmm_cmd_b64 is not valid base64"
elif [ -n "$pvmm_cmd" ]; then
    printf '%s\n' "$pvmm_cmd" > /tmp/pvmm-cmd.sh
fi
if [ -s /tmp/pvmm-cmd.sh ]; then
    echo "pvmm-guest: command begin"
    sh /tmp/pvmm-cmd.sh < /dev/null 2>&1
    echo "pvmm-guest: command exit status $?"
else
    echo "pvmm-guest: no command (give pvmm_cmd_b64=... or pvmm_cmd=\"...\" on the kernel command line)"
fi
echo "pvmm-guest: powering off"
poweroff -f
sleep 5
echo "pvmm-guest: error: poweroff -f returned"
