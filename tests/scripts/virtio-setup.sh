#!/bin/sh
# rig_virtio's L1 setup, before the VMs start: the read-only disk's image (RO_BYTES random
# bytes) and its checksum, to compare after the guest tried to write it.
head -c "$RO_BYTES" /dev/urandom > /tmp/rig-ro.img
md5sum < /tmp/rig-ro.img > /tmp/rig-ro.sum
