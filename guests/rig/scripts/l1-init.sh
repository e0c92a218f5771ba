#!/bin/sh
# The rig L1's /init (busybox sh): mounts, loads the KVM modules with the run's tuning,
# starts a heartbeat, runs /rig/job.sh (the per-run layer) and powers L1 off.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
read -r up _ < /proc/uptime
echo "@@rig@@ l1-init - $up"
echo "@@rig@@ l1-cpus - $(nproc)"
# The files below come with the images at run time, not from this folder.
# shellcheck disable=SC1091
. /rig/lib.sh
# The run's tuning (module parameters) comes with the job layer.
RIG_KVM_PARAMS=
RIG_KVM_AMD_PARAMS=
if [ -f /rig/tuning.sh ]; then
    # shellcheck disable=SC1091
    . /rig/tuning.sh
fi
insmod /lib/modules/rig/irqbypass.ko || echo "@@rig@@ error - insmod-irqbypass-failed"
# The parameters are a list of name=value words: split on purpose.
# shellcheck disable=SC2086
insmod /lib/modules/rig/kvm.ko $RIG_KVM_PARAMS || echo "@@rig@@ error - insmod-kvm-failed"
# shellcheck disable=SC2086
insmod /lib/modules/rig/kvm-amd.ko $RIG_KVM_AMD_PARAMS \
    || echo "@@rig@@ error - insmod-kvm-amd-failed"
if [ ! -c /dev/kvm ]; then
    echo "@@rig@@ error - no-dev-kvm"
fi
# What KVM actually runs with (a parameter the emulated CPU cannot back reads 0 or N).
rig_params=
for p in kvm/halt_poll_ns kvm_amd/npt kvm_amd/nested kvm_amd/vgif kvm_amd/vls kvm_amd/avic \
    kvm_amd/pause_filter_count kvm_amd/nrips; do
    rig_params="$rig_params ${p#*/}=$(cat /sys/module/${p%/*}/parameters/${p#*/} 2> /dev/null)"
done
echo "@@rig@@ kvm-params -$rig_params"
# Heartbeat: the host ends the run as frozen when L1 prints nothing for long (see pvmm-rig's
# L1_SILENCE_LIMIT). Pinned to CPU 0 with the rig's other plumbing.
(
    while :; do
        read -r up _ < /proc/uptime
        echo "@@rig@@ l1-alive - $up"
        sleep 10
    done
) &
taskset -p 1 $! > /dev/null 2>&1
if [ -f /rig/job.sh ]; then
    # shellcheck disable=SC1091
    . /rig/job.sh
else
    echo "@@rig@@ error - no-job"
fi
echo "@@rig@@ l1-poweroff - 0"
poweroff -f
