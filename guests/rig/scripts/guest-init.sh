#!/bin/sh
# The rig guest's /init (busybox sh), in its initramfs and on its root disk.
# From the initramfs: mounts, loads the virtio drivers when the VM has virtio devices, and with
# root=/dev/vda on the kernel command line mounts the root disk and switches to it, where this
# same script goes on (the disk alone holds /etc/pvmm-root-disk). Then it configures eth0 when
# given pvmm_net=ADDRESS/PREFIX,GATEWAY, runs the command given on the kernel command line as
# pvmm_cmd_b64=<base64 of a shell script> or pvmm_cmd="<shell command>", prints its output,
# and powers off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

# wait_for PATH TEST: up to 10 s for `test TEST PATH` to hold (a driver's device appears after
# its probe, which may finish after insmod returns).
wait_for() {
    wait_polls=0
    while ! test "$2" "$1" && [ $wait_polls -lt 100 ]; do
        sleep 0.1
        wait_polls=$((wait_polls + 1))
    done
    test "$2" "$1"
}

# has_virtio: whether the VM has virtio devices. pvmm's are described in the DSDT (LNRO0005,
# the virtio-mmio driver's ACPI id), QEMU's are PCI functions of vendor 0x1af4.
has_virtio() {
    for device in /sys/bus/acpi/devices/LNRO0005:*; do
        [ -e "$device" ] && return 0
    done
    grep -qs 0x1af4 /sys/bus/pci/devices/*/vendor
}

if [ ! -e /etc/pvmm-root-disk ]; then
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mount -t devtmpfs devtmpfs /dev
    read -r uptime _ < /proc/uptime
    echo "pvmm-guest: init reached, uptime $uptime"
    # From here on the console is the command's: the kernel prints only errors and worse on
    # it (console loglevel 4), not the warnings a loaded host brings (clocksource watchdog,
    # slow timer interrupts), which would land in the middle of the command's lines. dmesg
    # keeps them.
    echo 4 > /proc/sys/kernel/printk
    if has_virtio; then
        while read -r module; do
            insmod "$module" || echo "pvmm-guest: error: insmod $module failed"
        done < /lib/modules/virtio/order
    fi
    case " $(cat /proc/cmdline) " in
    *" root=/dev/vda "*)
        mkdir -p /newroot
        if wait_for /dev/vda -b && mount -t ext4 /dev/vda /newroot; then
            for fs in proc sys dev; do
                mount --move /$fs /newroot/$fs
            done
            exec switch_root /newroot /init
        fi
        echo "pvmm-guest: error: cannot mount /dev/vda as root; staying on the initramfs"
        ;;
    esac
else
    echo "pvmm-guest: root is /dev/vda"
fi

if [ -n "$pvmm_net" ]; then
    ip link set lo up
    if wait_for /sys/class/net/eth0 -e \
        && ip addr add "${pvmm_net%,*}" dev eth0 \
        && ip link set eth0 up \
        && ip route add default via "${pvmm_net#*,}"; then
        echo "pvmm-guest: eth0 is ${pvmm_net%,*}, gateway ${pvmm_net#*,}"
    else
        echo "pvmm-guest: error: cannot configure eth0 as $pvmm_net"
    fi
fi

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
