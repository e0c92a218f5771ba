#!/bin/sh
# The rig L1's shell functions (rig_tag, rig_run) for the per-run job, sourced by /init.

# rig_tag TAG: copies stdin to the console, each line prefixed "@@TAG@@ ", and reports L1's
# uptime when the guest's init marker passes (boot-time measurement). A guest line containing
# "pvmm-mark: TEXT" appends "<L1 uptime> TEXT" to /tmp/rig-marks, so L1 probes can tell when
# the guest did something (e.g. started its load).
rig_tag() {
    while IFS= read -r line || [ -n "$line" ]; do
        echo "@@$1@@ $line"
        case "$line" in
        *"pvmm-mark: "*)
            read -r up _ < /proc/uptime
            echo "$up ${line##*pvmm-mark: }" >> /tmp/rig-marks
            ;;
        *"pvmm-guest: init reached"*)
            read -r up _ < /proc/uptime
            echo "@@rig@@ guest-init $RIG_LABEL $up"
            echo "@@rig@@ guest-uptime $RIG_LABEL ${line##*uptime }"
            ;;
        esac
    done
}

# rig_run LABEL LIMIT_SECS CMD...: runs an inner VMM with its stdout and stderr tagged
# "guest/LABEL" and "vmm/LABEL", kills it after LIMIT_SECS (0: no limit), runs /rig/probe.sh
# alongside it when present (with PVMM_PID set to the VMM's pid and RIG_LABEL to LABEL, its
# output tagged "probe/LABEL"), and reports the VMM's exit status. Runs with different labels may run at
# the same time (`rig_run a 0 ... & rig_run b 0 ... &`): each has its own pipes.
# The VMM's stdin (its guest's serial console input) is /dev/null, or, when $RIG_CONSOLE_INPUT
# is set, the fifo /tmp/rig-run-LABEL/in, held open for writing for the run's life so that
# the VMM never reads its end: a line an L1 probe writes there reaches the guest's console.
rig_run() {
    RIG_LABEL=$1
    rig_limit=$2
    shift 2
    rig_dir=/tmp/rig-run-$RIG_LABEL
    rm -rf "$rig_dir"
    mkdir -p "$rig_dir"
    mkfifo "$rig_dir/out" "$rig_dir/err"
    # The tagging loops run on CPU 0 (package 0), as the probes do: the rig's own plumbing
    # must not wake the packages whose idleness is measured.
    rig_tag "guest/$RIG_LABEL" < "$rig_dir/out" &
    rig_tag_out=$!
    taskset -p 1 $rig_tag_out > /dev/null 2>&1
    rig_tag "vmm/$RIG_LABEL" < "$rig_dir/err" &
    rig_tag_err=$!
    taskset -p 1 $rig_tag_err > /dev/null 2>&1
    rig_in=/dev/null
    rig_in_holder=
    if [ -n "$RIG_CONSOLE_INPUT" ]; then
        rig_in=$rig_dir/in
        mkfifo "$rig_in"
        # Opening a fifo waits for its other end: this writer and the VMM's stdin open together.
        sleep 100000 > "$rig_in" &
        rig_in_holder=$!
    fi
    read -r up _ < /proc/uptime
    echo "@@rig@@ vmm-start $RIG_LABEL $up"
    # busybox timeout execs the command in its own process, so $! is the VMM's pid.
    if [ "$rig_limit" -gt 0 ]; then
        timeout -s KILL "$rig_limit" "$@" > "$rig_dir/out" 2> "$rig_dir/err" < "$rig_in" &
    else
        "$@" > "$rig_dir/out" 2> "$rig_dir/err" < "$rig_in" &
    fi
    RIG_VMM_PID=$!
    rig_probe_pid=
    if [ -f /rig/probe.sh ]; then
        # Until the background shell has opened the pipes and exec'd the VMM, $! is that
        # shell's process: the probe starts once /proc shows the VMM itself there, so
        # PVMM_PID's command line, threads and files are the VMM's from the probe's first
        # line. The wait is bounded (100 polls): a VMM that fails to start leaves a zombie
        # that kill -0 still finds.
        rig_exe=$(readlink -f "$(command -v "$1")")
        rig_polls=0
        while [ "$(readlink /proc/$RIG_VMM_PID/exe 2>/dev/null)" != "$rig_exe" ] \
            && [ $rig_polls -lt 100 ]; do
            sleep 0.05
            rig_polls=$((rig_polls + 1))
        done
        PVMM_PID=$RIG_VMM_PID RIG_LABEL=$RIG_LABEL sh /rig/probe.sh < /dev/null 2>&1 | rig_tag "probe/$RIG_LABEL" &
        rig_probe_pid=$!
    fi
    wait $RIG_VMM_PID
    rig_status=$?
    if [ -n "$rig_in_holder" ]; then
        kill "$rig_in_holder" 2> /dev/null
    fi
    wait $rig_tag_out
    wait $rig_tag_err
    if [ -n "$rig_probe_pid" ]; then
        wait $rig_probe_pid
    fi
    echo "@@rig@@ vmm-exit $RIG_LABEL $rig_status"
}

# rig_tap NAME ADDRESS/PREFIX: creates the tap NAME (loading L1's tap driver the first time)
# with L1's address on it, up, for an inner VMM to open.
rig_tap() {
    if [ ! -c /dev/net/tun ]; then
        insmod /lib/modules/rig/tun.ko || echo "@@rig@@ error - insmod-tun-failed"
    fi
    tunctl -t "$1" > /dev/null || echo "@@rig@@ error - tunctl-$1-failed"
    ip addr add "$2" dev "$1" || echo "@@rig@@ error - tap-address-$1-failed"
    ip link set "$1" up || echo "@@rig@@ error - tap-up-$1-failed"
}
