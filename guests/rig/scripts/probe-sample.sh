#!/bin/sh
# probe_sample [FILE...]: one placement-probe sample on stdout, from one awk process: `T <L1
# uptime>`, `C cpuN <counters>` per CPU, and `V vcpuN TID ALLOWED UTIME STIME LAST_CPU` per
# vCPU thread of the VMM $PVMM_PID; when $PROBE_THREADS names a file, appends `F TID MODE NAME`
# (each thread's seccomp mode) to it. FILEs are read as further thread stat/status files.
# Sourced: defines the function only.
probe_sample() {
awk -v threads="$PROBE_THREADS" 'BEGIN {
  if ((getline line < "/proc/uptime") > 0) { split(line, w, " "); print "T", w[1] }
  while ((getline line < "/proc/stat") > 0) if (line ~ /^cpu[0-9]/) print "C", line
  for (i = 1; i < ARGC; i++) {
    f = ARGV[i]; n = split(f, path, "/"); tid = path[n - 1]
    if (path[n] == "stat") {
      if ((getline line < f) > 0) {
        lp = index(line, "("); rest = substr(line, lp + 1); rp = match(rest, /\) [A-Za-z] /)
        name = substr(rest, 1, rp - 1); split(substr(rest, rp + 2), w, " ")
        if (name ~ /^CPU [0-9]+\/KVM$/) { split(name, q, "[ /]"); name = "vcpu" q[2] }
        names[tid] = name
        if (name ~ /^vcpu[0-9]+$/) { comm[tid] = name; times[tid] = w[12] " " w[13] " " w[37] }
      }
    } else {
      while ((getline line < f) > 0) {
        if (line ~ /^Cpus_allowed_list:/) { split(line, w, " "); allowed[tid] = w[2] }
        else if (line ~ /^Seccomp:/) { split(line, w, " "); mode[tid] = w[2] }
      }
    }
    close(f)
  }
  for (tid in comm) if (tid in allowed) print "V", comm[tid], tid, allowed[tid], times[tid]
  if (threads != "") for (tid in mode) if (tid in names) print "F", tid, mode[tid], names[tid] >> threads
}' "$@" /proc/"$PVMM_PID"/task/*/stat /proc/"$PVMM_PID"/task/*/status
}
