//! `apm run`'s program as a shell runs a job: in a process group of its own, given the
//! terminal when `apm run` has it, its stops passed up to the shell, every signal that
//! would end `apm run` passed to the whole group, and what is left of the group ended
//! once the program has exited.
//!
//! - **Its own process group**, so that a signal reaches the program and every child it
//!   started (`killpg`), and nothing of it outlives the run.
//! - **The terminal**: when standard input is the terminal and `apm run` is in its
//!   foreground, the program's group becomes the foreground (Ctrl-C, Ctrl-Z and reads
//!   reach it as without apm), and the terminal comes back before `apm run` writes its
//!   summary. A program stopped (Ctrl-Z, a background read) stops `apm run` too, so
//!   the shell's job control sees it; continued, `apm run` continues the program.
//! - **Signals to `apm run`** (HUP, INT, QUIT, TERM, USR1, ... every one that would end
//!   it: [`crate::signals::ENDING`]) go to the program's group; `apm run` ends when the
//!   program does.
//! - **The end**: once the program has exited, its group's remaining processes get
//!   SIGTERM, and SIGKILL after [`GRACE`].
//! - **SIGKILL**, which `apm run` cannot catch: the program gets it too
//!   (`PR_SET_PDEATHSIG`, provider-verbs' `ffi::child`), as it would have in `apm
//!   run`'s own process group, so a supervisor that kills that group leaves nothing.

use nix::sys::signal::{killpg, pthread_sigmask, raise, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt as _;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long what is left of the program's group has after SIGTERM, before SIGKILL.
const GRACE: Duration = Duration::from_secs(2);

/// Why the program did not start, with the status a shell would give.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {program}: {source}")]
pub(super) struct SpawnError {
    program: String,
    source: std::io::Error,
}

impl SpawnError {
    /// 127 for a program not found, 126 for one found that cannot be executed (as
    /// POSIX shells say).
    pub(super) fn status(&self) -> i32 {
        if self.source.kind() == std::io::ErrorKind::NotFound {
            127
        } else {
            126
        }
    }
}

/// The running program.
#[derive(Debug)]
pub(super) struct Job {
    pid: Pid,
    /// Whether the terminal was handed to the program's group (and must come back).
    terminal: bool,
}

/// Start `cmd` in a process group of its own, handing it the terminal when `apm run`
/// holds it.
pub(super) fn spawn(mut cmd: std::process::Command, program: &str) -> Result<Job, SpawnError> {
    cmd.process_group(0);
    // SIGKILL, which `apm run` cannot pass on, must not leave the program behind.
    provider_verbs::ffi::child::die_with_parent(&mut cmd);
    let child = cmd.spawn().map_err(|source| SpawnError {
        program: program.to_owned(),
        source,
    })?;
    let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    // The child is waited for by pid below; dropping `Child` neither kills nor reaps.
    drop(child);
    let stdin = std::io::stdin();
    let terminal = stdin.is_terminal()
        && tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == getpgrp())
        && give_terminal(pid);
    Ok(Job { pid, terminal })
}

/// Make `pgrp` the terminal's foreground group; SIGTTOU is blocked meanwhile, since a
/// process outside the foreground group asking this would be stopped by it.
fn give_terminal(pgrp: Pid) -> bool {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_err() {
        return false;
    }
    let given = tcsetpgrp(std::io::stdin().as_fd(), pgrp).is_ok();
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    given
}

impl Job {
    /// Wait for the program to exit, passing `signals` to its group and its stops to
    /// the shell; its status as a shell gives it (the code, or 128 + the signal).
    pub(super) async fn wait(&self, mut signals: mpsc::UnboundedReceiver<Signal>) -> i32 {
        let (tx, mut states) = mpsc::unbounded_channel();
        let pid = self.pid;
        // waitpid with WUNTRACED (tokio's child handle does not report stops), on a
        // thread of its own.
        std::thread::spawn(move || loop {
            let state = waitpid(pid, Some(WaitPidFlag::WUNTRACED));
            let done = !matches!(state, Ok(WaitStatus::Stopped(..)) | Err(nix::Error::EINTR));
            if tx.send(state).is_err() || done {
                return;
            }
        });
        loop {
            tokio::select! {
                Some(state) = states.recv() => match state {
                    Ok(WaitStatus::Exited(_, code)) => return code,
                    Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
                    Ok(WaitStatus::Stopped(..)) => self.stopped(),
                    Ok(_) | Err(nix::Error::EINTR) => {}
                    // Nothing left to wait for (ECHILD): reaped elsewhere.
                    Err(_) => return 127,
                },
                Some(sig) = signals.recv() => {
                    let _ = killpg(self.pid, sig);
                }
            }
        }
    }

    /// The program stopped: stop `apm run` too (its shell sees the job stopped), and
    /// when continued, continue the program, in the foreground again if `apm run` is.
    fn stopped(&self) {
        if self.terminal {
            give_terminal(getpgrp());
        }
        let _ = raise(Signal::SIGSTOP);
        // Continued (`fg` or `bg`).
        let stdin = std::io::stdin();
        if self.terminal && tcgetpgrp(stdin.as_fd()).is_ok_and(|fg| fg == getpgrp()) {
            give_terminal(self.pid);
        }
        let _ = killpg(self.pid, Signal::SIGCONT);
    }

    /// After the program exited: the terminal back to `apm run`, and what is left of
    /// the program's group ended (SIGTERM, then SIGKILL after [`GRACE`]).
    pub(super) async fn finish(&self) {
        if self.terminal {
            give_terminal(getpgrp());
        }
        if killpg(self.pid, Signal::SIGTERM).is_err() {
            return; // nobody left
        }
        let step = Duration::from_millis(20);
        let mut waited = Duration::ZERO;
        while waited < GRACE {
            tokio::time::sleep(step).await;
            waited += step;
            if killpg(self.pid, None).is_err() {
                return;
            }
        }
        let _ = killpg(self.pid, Signal::SIGKILL);
    }
}
