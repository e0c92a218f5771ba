#!/bin/sh
# rig_boot's L1 probe beside each VMM: the most QEMU vCPU threads (`CPU N/KVM`) the VMM $PVMM_PID
# had at once, polled every second while it runs; 0 beside pvmm, whose vCPU threads are `vcpuN`.
n=0
while kill -0 "$PVMM_PID" 2>/dev/null; do
    kvm=$(cat /proc/"$PVMM_PID"/task/*/comm 2>/dev/null | grep -c KVM)
    [ "$kvm" -gt "$n" ] && n=$kvm
    sleep 1
done
echo "vcpu threads seen: $n"
