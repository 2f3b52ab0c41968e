//! How `apm watch` ends and how it runs `--exec`: every signal that would end apm
//! (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, ...) stops the watch cleanly ([`Stop`]),
//! and each `--exec` command runs in a process group of its own with
//! a time limit, so that a hung hook is reported and killed, and no hook outlives apm:
//! what a hook leaves in its group when it exits is ended, and a stop or a timeout ends
//! the hook's whole process tree, what left the group included (`tree.rs`).
//!
//! A hook runs on a thread of its own with its own real-time runtime: under `--sim` the
//! watch's runtime runs a paused (virtual) clock, on which a time limit would expire at
//! once; a blocking task also holds that virtual clock still while the hook runs, so the
//! simulation waits for it as a real fabric cannot. Nothing here reads events or prints
//! them.

use super::tree;
use crate::out::errln;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt as _;
use std::time::Duration;
use tokio::sync::watch;

/// How long a hook has, after SIGTERM to its process group, before SIGKILL.
const GRACE: Duration = Duration::from_secs(1);

/// The signal that asked the watch to stop, once one did. Clones share it.
#[derive(Clone, Debug)]
pub(super) struct Stop(watch::Receiver<Option<i32>>);

impl Stop {
    /// Listen for every signal that would end apm (SIGINT, SIGTERM, SIGHUP, SIGQUIT,
    /// SIGUSR1, ...: [`crate::signals::ENDING`]), inside a runtime with IO enabled: the
    /// first stops the watch, which ends its hooks before it ends itself.
    pub(super) fn install() -> anyhow::Result<Stop> {
        let mut signals = crate::signals::listen(&crate::signals::ENDING)?;
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let Some(sig) = signals.recv().await else {
                return;
            };
            let _ = tx.send(Some(sig as i32));
            // Keep the handlers (and this sender) alive: a second signal is absorbed
            // while the watch cleans up.
            while signals.recv().await.is_some() {}
        });
        Ok(Stop(rx))
    }

    /// A stop that never comes (tests).
    #[cfg(test)]
    pub(super) fn never() -> Stop {
        Stop(watch::channel(None).1)
    }

    /// The signal received, if any.
    pub(super) fn signal(&self) -> Option<i32> {
        *self.0.borrow()
    }

    /// Wait for a stop signal (for ever when none comes).
    pub(super) async fn wait(&mut self) -> i32 {
        match self.0.wait_for(Option::is_some).await {
            Ok(s) => s.unwrap_or(0),
            Err(_) => std::future::pending().await,
        }
    }
}

/// After a clean stop by `signal`: end the process the way that signal would have, so
/// a calling shell sees a watch interrupted (status 130 or 143), not one that finished.
pub(super) fn die_of(signal: i32) -> ! {
    crate::log_writer::flush();
    let _ = signal_hook::low_level::emulate_default_handler(signal);
    std::process::exit(128 + signal)
}

/// How a hook ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// It exited by itself (successfully or not: reported either way).
    Exited,
    /// It ran past the time limit and was killed.
    TimedOut,
    /// The watch was asked to stop; the hook was killed.
    Stopped,
}

/// Run `sh -c cmd` with `env` for the event `what` (for messages), within `limit`, and
/// kill its process group when it runs past it or `stop` fires. With `json` the hook's
/// standard output goes to apm's standard error: the watch's own output stays one JSON
/// object a line.
pub(super) async fn run(
    cmd: &str,
    env: Vec<(&'static str, String)>,
    what: String,
    limit: Duration,
    stop: Stop,
    json: bool,
) -> Ended {
    let cmd = cmd.to_owned();
    let job = tokio::task::spawn_blocking(move || {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                errln!("apm watch: cannot run --exec for {what}: {e}");
                return Ended::Exited;
            }
        };
        rt.block_on(run_here(&cmd, env, &what, limit, stop, json))
    });
    job.await.unwrap_or(Ended::Exited)
}

async fn run_here(
    cmd: &str,
    env: Vec<(&'static str, String)>,
    what: &str,
    limit: Duration,
    mut stop: Stop,
    json: bool,
) -> Ended {
    if stop.signal().is_some() {
        return Ended::Stopped;
    }
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(cmd)
        .envs(env)
        .stdin(std::process::Stdio::null())
        // Its own process group: the shell and everything it starts are killed together.
        .process_group(0);
    if json {
        use std::os::fd::AsFd as _;
        if let Ok(err) = std::io::stderr().as_fd().try_clone_to_owned() {
            command.stdout(std::process::Stdio::from(err));
        }
    }
    let mut child = match tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            errln!("apm watch: could not run --exec command for {what}: {e}");
            return Ended::Exited;
        }
    };
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    let ended = tokio::select! {
        st = child.wait() => {
            match st {
                Ok(st) if st.success() => {}
                Ok(st) => errln!("apm watch: --exec command for {what} exited with {st}"),
                Err(e) => errln!("apm watch: waiting for the --exec command for {what}: {e}"),
            }
            if let Some(group) = group {
                end_stragglers(group, what).await;
            }
            return Ended::Exited;
        }
        () = tokio::time::sleep(limit) => {
            errln!(
                "apm watch: --exec command for {what} still running after {} s \
                 (--exec-timeout): killed",
                limit.as_secs_f64()
            );
            Ended::TimedOut
        }
        _ = stop.wait() => Ended::Stopped,
    };
    if let Some(group) = group {
        // What the hook started, also what left its group (`setsid`): found while the
        // shell still holds it, before the orphans go to init.
        let started = tree::descendants(group.as_raw());
        let _ = killpg(group, Signal::SIGTERM);
        tree::signal_all(&started, Signal::SIGTERM);
        let _ = tokio::time::timeout(GRACE, child.wait()).await;
        // The shell may be gone; what it started may not be.
        let _ = killpg(group, Signal::SIGKILL);
        tree::signal_all(&started, Signal::SIGKILL);
    }
    let _ = child.kill().await;
    ended
}

/// A hook that exited is over: what it left running in its process group (`cmd &`)
/// is ended too, TERM then KILL after [`GRACE`], so that no hook outlives its turn,
/// nor apm. (The group cannot be another's while any of its processes lives.)
async fn end_stragglers(group: Pid, what: &str) {
    if killpg(group, None).is_err() {
        return; // nothing left in the group
    }
    // Said once: a hook that always backgrounds something would say it every event.
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        errln!(
            "apm watch: --exec command for {what} left processes running in its process \
         group: ended (run a daemon with setsid)"
        );
    }
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + GRACE;
    while killpg(group, None).is_ok() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = killpg(group, Signal::SIGKILL);
}
