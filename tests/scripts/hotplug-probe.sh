#!/bin/sh
# rig_hotplug's L1 side, before the placement probe (so for each run, with its $PVMM_PID):
# - a watcher that carries out the guest's `cpus-off`/`cpus-on` marks in order, polling every
#   $MARK_POLL_S seconds (the marks end in the guest console's carriage return);
# - in the run $HOST_RUN, the daemon (`pvmm host -v`, pinned to CPU 0, which never goes
#   offline), ended once that pvmm has exited, when its log is printed, each line after
#   $DAEMON_LOG_PREFIX.
# The other background jobs write nowhere: the rig reads the probe's output until every writer
# has closed it.
(
    seen=0
    while kill -0 "$PVMM_PID" 2>/dev/null; do
        grep -E ' cpus-(off|on) ' /tmp/rig-marks 2>/dev/null | tr -d '\r' \
            | sed -n "$((seen + 1)),\$p" > /tmp/hotplug-new
        while read -r _ what cpus; do
            v=1
            [ "$what" = cpus-off ] && v=0
            for c in $(echo "$cpus" | tr , ' '); do
                echo $v > "/sys/devices/system/cpu/cpu$c/online"
            done
            echo "$(cut -d' ' -f1 /proc/uptime) $what-done $cpus" >> /tmp/rig-marks
            seen=$((seen + 1))
        done < /tmp/hotplug-new
        sleep "$MARK_POLL_S"
    done
) > /dev/null 2>&1 &
if [ "$PVMM_RUN_LABEL" = "$HOST_RUN" ]; then
    taskset -c 0 /bin/pvmm host -v --runtime-dir "$RUNTIME_DIR" --policy performance --tick-ms 100 \
        > /tmp/pvmm-host.log 2>&1 &
    host=$!
    (
        while kill -0 "$PVMM_PID" 2>/dev/null; do sleep 0.5; done
        kill $host
        i=0
        while [ $i -lt "$DAEMON_EXIT_POLLS" ] && kill -0 $host 2>/dev/null; do
            sleep 0.2
            i=$((i + 1))
        done
        sed "s/^/$DAEMON_LOG_PREFIX/" /tmp/pvmm-host.log
    ) 2>/dev/null &
fi
