#!/bin/sh
# rig_cgroup's L1 setup, before the VM starts: mounts cgroup2 with the cpuset controller and
# makes the cgroup $CGROUP whose cpuset is $CPUS, starts the host daemon outside it under the
# performance policy (which spreads a busy VM over every package it may), then moves L1's init
# shell into the cgroup, and with it the VM and its probe, started after. Errors go to
# /tmp/cgroup-setup.log, which the probe prints.
{
    mkdir -p /sys/fs/cgroup "$RUNTIME_DIR"
    mount -t cgroup2 none /sys/fs/cgroup || echo "CGROUP error mount"
    echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control || echo "CGROUP error controller"
    mkdir "/sys/fs/cgroup/$CGROUP" || echo "CGROUP error mkdir"
    echo "$CPUS" > "/sys/fs/cgroup/$CGROUP/cpuset.cpus" || echo "CGROUP error cpus"
} > /tmp/cgroup-setup.log 2>&1
/bin/pvmm host --runtime-dir "$RUNTIME_DIR" --policy performance --tick-ms 100 -v \
    > /tmp/pvmm-host.log 2>&1 &
echo $$ > "/sys/fs/cgroup/$CGROUP/cgroup.procs" || echo "CGROUP error join" >> /tmp/cgroup-setup.log
