//! L1's CPU priority on the host.
//!
//! L1's QEMU emulates four or more CPUs, one TCG thread each, on a host that may have two. Any
//! other work on the host (a build, a second test binary, a busy neighbour) takes its share of
//! those CPUs from L1's threads, and a starved L1 misreads every measurement made in it: its
//! timer ticks come late, so a vCPU thread that runs all the time is charged only part of the
//! interval, and neither pvmm nor the probe can tell it from a half-idle one. The rig therefore
//! starts QEMU at a raised priority, so that on a shared host L1 gets the CPUs first. The
//! priority cannot shield L1 from what a hypervisor under the host takes (steal time).

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The nice value L1's QEMU starts at: a CFS weight 9.3 times a nice-0 task's, so four busy
/// TCG threads beside two busy nice-0 loops are owed about 95 % of two CPUs, and the rig's own
/// threads (console readers, the test) still run, since they sleep almost always.
pub const L1_NICE: i32 = -10;

/// Makes `command` start at [`L1_NICE`]. Where the host refuses (neither root nor
/// `CAP_SYS_NICE`), the child keeps its parent's nice value; [`report`] tells the user.
pub fn raise(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec and calls only setpriority(2),
    // which is async-signal-safe and touches no memory of the parent's.
    unsafe {
        command.pre_exec(|| {
            // Best effort: a refusal leaves the nice value as it was, and the run goes on.
            libc::setpriority(libc::PRIO_PROCESS, 0, L1_NICE);
            Ok(())
        });
    }
}

/// The nice value of process `pid`, from `/proc/<pid>/stat` (field 19).
pub fn nice_of(pid: u32) -> io::Result<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_nice(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("no nice value in /proc/{pid}/stat"),
        )
    })
}

/// Field 19 of a `/proc/<pid>/stat` line; the command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn parse_nice(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name: nice (19) is the 17th of them.
    rest.split_whitespace().nth(16)?.parse().ok()
}

/// A line for the user when QEMU (`pid`) did not get [`L1_NICE`], else `None`.
pub fn report(pid: u32) -> Option<String> {
    match nice_of(pid) {
        Ok(L1_NICE) => None,
        Ok(nice) => Some(format!(
            "L1's QEMU runs at nice {nice}, not {L1_NICE} (raising it needs root or CAP_SYS_NICE): other work on this machine will slow L1 and blur its measurements"
        )),
        Err(error) => Some(format!("cannot read L1's QEMU's nice value: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_is_field_19_even_after_an_odd_command_name() {
        let stat =
            "4242 (qemu (x) 1) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 6 0 0 20 -10 7 0 1000 1 2";
        assert_eq!(parse_nice(stat), Some(-10));
        assert_eq!(parse_nice("4242 (qemu) S 1"), None);
        assert_eq!(parse_nice("no parenthesis"), None);
    }

    #[test]
    fn a_child_started_with_raise_gets_l1_nice_or_keeps_ours() {
        let ours = nice_of(std::process::id()).expect("our own nice value");
        let mut command = Command::new("sleep");
        command.arg("5");
        raise(&mut command);
        let mut child = command.spawn().expect("sleep starts");
        let nice = nice_of(child.id()).expect("the child's nice value");
        let _ = child.kill();
        let _ = child.wait();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        assert_eq!(nice, if root { L1_NICE } else { ours });
    }
}
