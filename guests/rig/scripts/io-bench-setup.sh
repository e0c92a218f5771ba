#!/bin/sh
# bench-io's L1 setup: the scratch disk every VM in turn writes and reads, MIB MiB, sparse.
dd if=/dev/zero of="$IMAGE" bs=1M count=0 seek="$MIB" 2> /dev/null
