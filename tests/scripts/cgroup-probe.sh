#!/bin/sh
# rig_cgroup's L1 probe: prints the VM's cgroup and its effective cpuset, samples every pvmm
# thread's allowed CPUs and last CPU every 0.5 s while pvmm runs (printed at the end, each
# distinct `T NAME ALLOWED LAST` once), and the daemon's status as one `STATUS <json>` line
# $STATUS_AFTER_SECS after the guest's `busy` mark.
echo "CGROUP $(cat /proc/"$PVMM_PID"/cgroup) $(cat "/sys/fs/cgroup/$CGROUP/cpuset.cpus.effective")"
sed 's/^/SETUP /' /tmp/cgroup-setup.log
status_at=
status_taken=
while kill -0 "$PVMM_PID" 2> /dev/null; do
    for task in /proc/"$PVMM_PID"/task/*; do
        name=$(cat "$task/comm" 2> /dev/null)
        allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "$task/status" 2> /dev/null)
        last=$(cut -d' ' -f39 "$task/stat" 2> /dev/null)
        # A thread that ends between these reads leaves a field empty: that sample is dropped.
        [ -n "$name" ] && [ -n "$allowed" ] && [ -n "$last" ] && echo "T $name $allowed $last"
    done >> /tmp/cgroup-samples
    read -r up _ < /proc/uptime
    if [ -z "$status_at" ] && grep -qs busy /tmp/rig-marks; then
        status_at=$((${up%.*} + STATUS_AFTER_SECS))
    fi
    if [ -z "$status_taken" ] && [ -n "$status_at" ] && [ "${up%.*}" -ge "$status_at" ]; then
        echo "STATUS $(/bin/pvmm host status --runtime-dir "$RUNTIME_DIR" --json | tr -d '\n')"
        status_taken=1
    fi
    sleep 0.5
done
sort -u /tmp/cgroup-samples
