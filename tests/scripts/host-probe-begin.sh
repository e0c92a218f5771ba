#!/bin/sh
# rig_host's L1 probe of each VM, its beginning (then the placement probe, then
# host-probe-end.sh). The first probe to start launches the daemon (`pvmm host`, the static
# pvmm's daemon, its pid in /tmp/pvmm-host.pid), the job that says `go` to the guests and,
# when $L1_JOB is `restart`, the kill-and-restart job, in the background (their output
# discarded: the rig reads the probe's output until every writer has closed it). Each probe
# samples its own VM into its own file and keeps the marks file shared with the other probes.

# start_daemon: starts the daemon and records its pid.
start_daemon() {
    /bin/pvmm host --runtime-dir "$RUNTIME_DIR" --adopt auto --tick-ms 100 -v >> /tmp/pvmm-host.log 2>&1 &
    echo $! > /tmp/pvmm-host.pid
}

# start_loads: once each of the boot's $VMS guests has marked `ready-N`, writes `go` to every
# guest's console (each run's fifo: the VMs run with console input), which starts their loads.
# Gives up after $GO_WAIT_SECS (the guests stop waiting then too) and sends `go` to whoever is
# there.
start_loads() {
    n=0
    until [ "$(grep -c ' ready-' /tmp/rig-marks 2>/dev/null)" -ge "$VMS" ]; do
        n=$((n + 1))
        [ $n -gt $((GO_WAIT_SECS * 5)) ] && break
        sleep 0.2
    done
    for fifo in /tmp/rig-run-*/in; do
        # In the background: a VM that already exited has no reader, and the write would wait.
        (echo go > "$fifo") &
    done
}

# tick_before: pvmm's --stats line of a tick that ended before now (the last whole line: the
# line after it may be half written), so that an L1 event is placed on pvmm's own clock.
tick_before() {
    tail -n 2 "$STATS_PATH" | head -n 1
}

# kill_and_restart: once the guest's fall mark is in (the mark keeps the console's carriage
# return, so it is matched without an end anchor), waits $KILL_AFTER_FALL_SECS, kills the
# daemon with SIGKILL, waits $RESTART_AFTER_KILL_SECS (past pvmm's lease) and starts it again;
# each step leaves a mark with pvmm's last tick before it. Gives up after 10 minutes without
# the mark.
kill_and_restart() {
    n=0
    until grep -q ' fall' /tmp/rig-marks 2>/dev/null; do
        n=$((n + 1))
        [ $n -gt 3000 ] && exit 0
        sleep 0.2
    done
    sleep "$KILL_AFTER_FALL_SECS"
    tick=$(tick_before)
    kill -9 "$(cat /tmp/pvmm-host.pid)"
    read -r up _ < /proc/uptime
    echo "$up host-killed $tick" >> /tmp/rig-marks
    sleep "$RESTART_AFTER_KILL_SECS"
    tick=$(tick_before)
    start_daemon
    read -r up _ < /proc/uptime
    echo "$up host-restarted $tick" >> /tmp/rig-marks
}

taskset -p 1 $$ >/dev/null 2>&1
if mkdir /tmp/pvmm-host-started 2>/dev/null; then
    start_daemon
    (start_loads) > /dev/null 2>&1 &
    if [ "$L1_JOB" = restart ]; then
        (kill_and_restart) > /dev/null 2>&1 &
    fi
fi
# Read by the placement probe, which follows.
# shellcheck disable=SC2034
PROBE_OUT=/tmp/pvmm-samples-$PVMM_PID
# shellcheck disable=SC2034
KEEP_MARKS=1
