#!/bin/sh
# L1 probe for `cargo xtask rig --l1-probe guests/probes/kvm-exits.sh`: counts the inner VM's
# exits over its whole run, from L1's kernel. While the VMM runs it keeps the last values of
# KVM's per-VM debugfs counters (all exits, and those to port I/O, MMIO, halts, interrupts,
# emulated instructions); L1's kvm_pio, kvm_mmio and kvm_userspace_exit trace events give the
# ports and addresses, and which exits reached the VMM. Printed when the VMM has exited.
T=/sys/kernel/tracing
[ -d $T/events ] || mount -t tracefs nodev $T 2>/dev/null
[ -d /sys/kernel/debug/kvm ] || mount -t debugfs nodev /sys/kernel/debug 2>/dev/null
# 8 MiB per CPU holds a whole boot's port I/O, MMIO and VMM exits many times over (about
# 3,000 of each kind under QEMU). No overwriting: a full buffer drops the newest events, and
# the count of those lost ends the report.
echo 8192 > $T/buffer_size_kb
echo 0 > $T/options/overwrite
for e in kvm_pio kvm_mmio kvm_userspace_exit; do echo 1 > $T/events/kvm/$e/enable; done
echo 1 > $T/tracing_on
while kill -0 "$PVMM_PID" 2>/dev/null; do
  # The counters of the last sample before the VMM ended.
  for d in /sys/kernel/debug/kvm/"$PVMM_PID"-*; do
    [ -f "$d/exits" ] && echo "exits $(cat "$d/exits"): io $(cat "$d/io_exits"), mmio $(cat "$d/mmio_exits"), halt $(cat "$d/halt_exits"), irq $(cat "$d/irq_exits"), emulated $(cat "$d/insn_emulation")" > /tmp/kvm-exits-last
  done
  sleep 0.5
done
echo 0 > $T/tracing_on
cat /tmp/kvm-exits-last 2>/dev/null
echo "port I/O (count, direction, port):"
grep kvm_pio $T/trace | sed 's/.*pio_\(read\|write\) at \(0x[0-9a-f]*\) .*/\1 \2/' | sort | uniq -c | sort -rn
echo "MMIO (count, guest physical address):"
grep kvm_mmio $T/trace | awk '{for (i = 1; i < NF; i++) if ($i == "gpa") print $(i + 1)}' | sort | uniq -c | sort -rn
echo "exits to the VMM (count, reason):"
grep kvm_userspace_exit $T/trace | sed 's/.*reason \([A-Za-z_0-9]*\).*/\1/' | sort | uniq -c | sort -rn
echo "events lost: $(cat $T/per_cpu/cpu*/stats | awk '/^(overrun|dropped events):/ {n += $NF} END {print n + 0}')"
