#!/usr/bin/env bash
# Builds the tiny PVH guest that halts forever (interrupts off, no CPU used) into DIR/halt.elf,
# for the scripts that measure pvmm with idle guests on this machine's /dev/kvm. Needs GNU as/ld.
#   vmm/scripts/halt-guest.sh DIR
set -euo pipefail
dir=${1:?usage: halt-guest.sh DIR}
cat > "$dir/halt.s" <<'ASM'
    .section .note.Xen, "a"
    .align 4
    .long 4, 4, 18          /* namesz, descsz, XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long _start
    .text
    .code32
    .globl _start
_start:
1:  hlt
    jmp 1b
ASM
as --64 "$dir/halt.s" -o "$dir/halt.o"
# -N: one segment from 1 MiB, no ELF headers loaded below it (pvmm refuses segments under 1 MiB).
ld -m elf_x86_64 -N --no-warn-rwx-segments -Ttext=0x100000 "$dir/halt.o" -o "$dir/halt.elf"
