#!/bin/sh
# rig_boot's L1 probe of a QEMU run: the most vCPU threads (`CPU N/KVM`) the VMM $PVMM_PID had
# at once, polled every second while it runs.
n=0
while kill -0 "$PVMM_PID" 2>/dev/null; do
    kvm=$(cat /proc/"$PVMM_PID"/task/*/comm 2>/dev/null | grep -c KVM)
    [ "$kvm" -gt "$n" ] && n=$kvm
    sleep 1
done
echo "vcpu threads seen: $n"
