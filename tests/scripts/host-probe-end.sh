#!/bin/sh
# rig_host's L1 probe of each VM, its end (after the placement probe): the last probe to end
# (no VM socket left) stops the daemon and prints its log, each line after `HOST `.
if ! ls "$RUNTIME_DIR"/*.sock >/dev/null 2>&1 && [ -f /tmp/pvmm-host.pid ]; then
    kill "$(cat /tmp/pvmm-host.pid)" 2>/dev/null && sleep 1 && sed 's/^/HOST /' /tmp/pvmm-host.log
fi
