//! What apm sets on a program it starts (`apm run`): it dies with apm.
//!
//! `apm run` puts its program in a process group of its own (job control: the terminal,
//! Ctrl-C and Ctrl-Z reach the program as they would without apm) and passes on every
//! signal it can catch. SIGKILL it cannot: a supervisor that kills `apm run`'s process
//! group (a test harness, a batch system without cgroups) would otherwise leave the
//! program running on, outside the group it killed, holding its QPs and its device. So
//! the program is asked to get SIGKILL when `apm run` dies (`PR_SET_PDEATHSIG`), as it
//! would have sharing the group.

use std::os::unix::process::CommandExt as _;

/// Make the child `cmd` starts get SIGKILL when the thread that starts it dies: call
/// on a thread that lives as long as the child should (`apm run`'s main thread).
pub fn die_with_parent(cmd: &mut std::process::Command) {
    // SAFETY: getpid is async-signal-safe and called before the fork.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid, _exit), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the request was made: then no signal
            // will come, and the child ends here as it would have.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            Ok(())
        });
    }
}
