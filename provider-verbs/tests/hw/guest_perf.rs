//! A profile of both pingpongs around a fault, for `bench failover --perf`: `perf
//! record` samples the CPU clock of every thread of both, its events off until the
//! fault (perf's own start costs the guest seconds of CPU under emulation), and its
//! report (by thread name, object and symbol) is printed per run. The image has `perf`
//! only when the host had Debian's `linux-perf`; without it the run says so and goes on.

/// Where the samples go.
const DATA: &str = "/tmp/perf.data";

/// `perf record`'s control FIFO.
const CONTROL: &str = "/tmp/perf-control";

/// A running `perf record`.
pub(crate) struct GuestPerf(std::process::Child);

impl GuestPerf {
    /// Start recording `pids`, events off; `None`, said why, when it cannot start.
    pub(crate) fn start(pids: &[u32]) -> Option<GuestPerf> {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let _ = std::fs::remove_file(CONTROL);
        let made = std::process::Command::new("mkfifo").arg(CONTROL).status();
        if !made.is_ok_and(|s| s.success()) {
            println!("  perf: no profile: mkfifo {CONTROL} failed");
            return None;
        }
        std::process::Command::new("perf")
            .args(["record", "-q", "-e", "cpu-clock", "-F", "4000", "-o", DATA])
            .args(["-D", "-1", "--control", &format!("fifo:{CONTROL}")])
            .args(["-p", &pids.join(",")])
            .spawn()
            .inspect_err(|e| {
                println!("  perf: no profile: {e} (the VM has perf when the host has linux-perf)");
            })
            .ok()
            .map(GuestPerf)
    }

    /// Tell perf to `enable` or `disable` its events. Opened without blocking: a perf
    /// that died has no reader on the FIFO, which is said, not waited for.
    pub(crate) fn control(&self, what: &str) {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let sent = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(CONTROL)
            .and_then(|mut f| writeln!(f, "{what}"));
        if let Err(e) = sent {
            println!("  perf: could not {what} the profile: {CONTROL}: {e}");
        }
    }

    /// Stop recording and print the report: where the samples fell, by thread name,
    /// object and symbol (entries of 0.7% or more, the first 60).
    pub(crate) fn report(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
        let out = std::process::Command::new("perf")
            .args(["report", "-i", DATA, "--stdio", "-q"])
            .args(["--sort", "comm,dso,sym", "--percent-limit", "0.7"])
            .output();
        let out = match out {
            Ok(out) => out,
            Err(e) => return println!("  perf: no report: {e}"),
        };
        for l in String::from_utf8_lossy(&out.stdout).lines().take(60) {
            println!("  perf: {l}");
        }
        for l in String::from_utf8_lossy(&out.stderr).lines().take(5) {
            println!("  perf (stderr): {l}");
        }
    }
}

impl Drop for GuestPerf {
    /// A run that panics midway leaves no perf behind.
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
