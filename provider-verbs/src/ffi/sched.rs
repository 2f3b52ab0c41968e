//! The calling thread's scheduling class: apm's control thread may run in the kernel's
//! real-time class (`SCHED_FIFO`), above the ordinary threads it shares the CPUs with.
//!
//! Why: a failover is a chain of short steps (an event read, the engine's decision, a
//! QP modify, a message to the peer, a timer), each of which waits for a CPU. On a host
//! whose cores are all busy (MPI and NCCL ranks poll their completion queues on every
//! core; a benchmark's traffic does the same in a small VM) each wake-up waits behind
//! the running threads' time slices, and the chain's waits add up to more than its
//! work. A `SCHED_FIFO` thread runs as soon as it is woken, ahead of every ordinary
//! thread. It must never spin: the kernel keeps 5% of each second for ordinary threads
//! (`sched_rt_runtime_us`), which is all that saves a host from a real-time thread
//! that does. apm's control thread only ever waits on events and timers.

use std::io;

/// Put the calling thread in `SCHED_FIFO` at `priority` (1 to 99). Needs
/// `CAP_SYS_NICE` or an `RLIMIT_RTPRIO` at least `priority`; the error says which errno.
pub fn set_thread_fifo(priority: u8) -> io::Result<()> {
    if !(1..=99).contains(&priority) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("real-time priority {priority}: must be 1 to 99"),
        ));
    }
    let param = libc::sched_param {
        sched_priority: i32::from(priority),
    };
    // SAFETY: `param` is a valid sched_param that outlives the call; pid 0 is the
    // calling thread (Linux schedules threads, and pid 0 names the caller's).
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Give the calling thread the `nice` value `nice` (-20 to 19; higher yields more): for
/// a helper thread whose work may wait (apm's log writer) so that it takes a CPU from
/// apm's own threads only when they do not need it. Raising the value needs no
/// privilege. On Linux `setpriority(PRIO_PROCESS, 0, ..)` names the calling thread
/// alone, not the whole process.
pub fn set_thread_nice(nice: i8) -> io::Result<()> {
    if !(-20..=19).contains(&nice) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("nice value {nice}: must be -20 to 19"),
        ));
    }
    // SAFETY: plain integers; who 0 is the calling thread on Linux.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, i32::from(nice)) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_priorities_are_refused_before_the_kernel_is_asked() {
        for p in [0, 100, 255] {
            let e = set_thread_fifo(p).expect_err("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{p}: {e}");
        }
    }

    #[test]
    fn a_thread_made_nicer_leaves_the_rest_of_the_process_as_it_was() {
        // SAFETY: plain integer calls; who 0 is the calling thread.
        let nice_here = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice_here();
        let theirs = std::thread::spawn(move || {
            set_thread_nice(19).expect("raising a thread's nice value needs no privilege");
            nice_here()
        })
        .join()
        .unwrap();
        assert_eq!(theirs, 19);
        assert_eq!(nice_here(), before);
        assert_eq!(
            set_thread_nice(20).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
