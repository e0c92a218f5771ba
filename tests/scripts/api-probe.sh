#!/bin/sh
# rig_api's L1 side, before the placement probe: the outside balancer's renewal loop (assigns
# vCPUs 0 and 1 to L1 CPU $EXTERNAL_CPU at $EXTERNAL_CAPACITY through $SOCKET every
# $BALANCER_RENEW_S seconds, between the guest's api-ready and api-release marks), and a
# sampler of pvmm's non-vCPU threads (`O <L1 uptime> <comm> <Cpus_allowed_list> <last CPU>
# <ns run> <tid>`, the time run from the thread's schedstat). Both write to files that an exit
# trap prints after the placement probe's own output (two writers on the probe's pipe could
# split each other's lines).
taskset -p 1 $$ >/dev/null 2>&1
trap 'wait; cat /tmp/api-renewals /tmp/own-samples 2>/dev/null' EXIT
(
    until grep -q api-ready /tmp/rig-marks 2>/dev/null; do
        kill -0 "$PVMM_PID" 2>/dev/null || exit 0
        sleep 0.2
    done
    a="\"cpus\":\"$EXTERNAL_CPU\",\"capacity\":$EXTERNAL_CAPACITY"
    echo "{\"assignments\":[{\"vcpu\":0,$a},{\"vcpu\":1,$a}]}" > /tmp/ext.json
    n=0
    until grep -q api-release /tmp/rig-marks; do
        /bin/pvmm ctl --socket "$SOCKET" external /tmp/ext.json > /dev/null && n=$((n + 1))
        kill -0 "$PVMM_PID" 2>/dev/null || break
        sleep "$BALANCER_RENEW_S"
    done
    echo "RENEWALS $n" > /tmp/api-renewals
) &
(
    while kill -0 "$PVMM_PID" 2>/dev/null; do
        awk 'BEGIN { if ((getline line < "/proc/uptime") > 0) { split(line, w, " "); up = w[1] }
          for (i = 1; i < ARGC; i++) {
            f = ARGV[i]; n = split(f, path, "/"); tid = path[n - 1]
            if (path[n] == "stat") {
              if ((getline line < f) > 0) { split(line, w, " "); if (w[2] !~ /^\(vcpu[0-9]+\)$/) { comm[tid] = w[2]; last[tid] = w[39] } }
            } else if (path[n] == "schedstat") {
              if ((getline line < f) > 0) { split(line, w, " "); ran[tid] = w[1] }
            } else {
              while ((getline line < f) > 0) if (line ~ /^Cpus_allowed_list:/) { split(line, w, " "); allowed[tid] = w[2] }
            }
            close(f)
          }
          for (tid in comm) if ((tid in allowed) && (tid in ran)) print "O", up, comm[tid], allowed[tid], last[tid], ran[tid], tid }' \
            /proc/"$PVMM_PID"/task/*/stat /proc/"$PVMM_PID"/task/*/status /proc/"$PVMM_PID"/task/*/schedstat >> /tmp/own-samples
        sleep 0.5
    done
) &
