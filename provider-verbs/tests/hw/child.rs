//! Child processes read line by line (`apm pingpong`, `apm watch`, the C example), and
//! the clock their reports state their times on.

use super::*;

/// Now on the wall clock, in ms since the Unix epoch: the clock `apm pingpong` and
/// `apm run --report` state the origin of their times on, which children and tests
/// share.
pub(crate) fn unix_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The report directories of running `apm run`s (each makes a private one,
/// `$TMPDIR/apm-run-PID-XXXXXX`, and its processes write their reports there after every
/// change): of the `apm run` whose PID is `pid`, or of every one still running.
pub(crate) fn run_report_dirs(pid: Option<u32>) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(owner) = name
                .strip_prefix("apm-run-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                return false;
            };
            // Of a running `apm run` only: one killed earlier leaves its directory.
            pid.map_or(
                std::path::Path::new(&format!("/proc/{owner}")).exists(),
                |p| p == owner,
            )
        })
        .map(|e| e.path())
        .collect()
}

/// A child process whose stdout or stderr is read line by line on a thread, so that a
/// test can wait for lines while the process runs. Every line is echoed with the
/// child's name and kept in `log`.
pub(crate) struct ChildLines {
    pub(crate) child: std::process::Child,
    pub(crate) lines: std::sync::mpsc::Receiver<String>,
    pub(crate) log: Vec<String>,
    pub(crate) name: &'static str,
}

impl ChildLines {
    /// Start `cmd` with stdin piped, and read its stderr (`stderr`; stdout is piped
    /// too, for the caller to collect at exit) or its stdout (stderr goes to the test's).
    pub(crate) fn spawn(
        mut cmd: std::process::Command,
        name: &'static str,
        stderr: bool,
    ) -> ChildLines {
        use std::io::BufRead;
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(if stderr {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::inherit()
            })
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let (tx, rx) = std::sync::mpsc::channel();
        let stream: Box<dyn std::io::Read + Send> = if stderr {
            Box::new(child.stderr.take().expect("piped"))
        } else {
            Box::new(child.stdout.take().expect("piped"))
        };
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        ChildLines {
            child,
            lines: rx,
            log: Vec::new(),
            name,
        }
    }

    /// The next line, before `until`; panics with the log so far when none comes.
    pub(crate) fn next_line(&mut self, until: Instant, waiting_for: &str) -> String {
        let left = until.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(l) => {
                println!("  [{}] {l}", self.name);
                self.log.push(l.clone());
                l
            }
            Err(_) => {
                let _ = self.child.kill();
                panic!(
                    "{}: no line with {waiting_for:?} in time; log so far:\n{}",
                    self.name,
                    self.log.join("\n")
                )
            }
        }
    }

    /// Read lines until one contains `what`; returns when it came, and the line.
    pub(crate) fn wait_for(&mut self, what: &str, limit: Duration) -> (Instant, String) {
        let until = Instant::now() + limit;
        loop {
            let l = self.next_line(until, what);
            if l.contains(what) {
                return (Instant::now(), l);
            }
        }
    }

    /// How many lines were read so far (for [`ChildLines::wait_for_all_since`]).
    pub(crate) fn mark(&self) -> usize {
        self.log.len()
    }

    /// Wait until, since `mark`, a line containing each of `all` was printed, in any
    /// order (lines already read count).
    pub(crate) fn wait_for_all_since(&mut self, mark: usize, all: &[&str], limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let since = self.log.get(mark..).unwrap_or(&[]);
            let Some(missing) = all.iter().find(|w| !since.iter().any(|l| l.contains(*w))) else {
                return;
            };
            self.next_line(until, missing);
        }
    }

    /// Write a line to the child's stdin.
    pub(crate) fn write_line(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush");
    }

    /// Close the child's stdin.
    pub(crate) fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Wait for the child to exit (killed after `limit`), echoing what it still prints.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + limit;
        loop {
            while let Ok(l) = self.lines.try_recv() {
                println!("  [{}] {l}", self.name);
                self.log.push(l);
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("{}: did not exit within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A running `apm pingpong`: its stderr lines as they come, its JSON report at the end.
pub(crate) struct Pingpong(pub(crate) ChildLines);

impl Pingpong {
    /// Start `apm pingpong` with the suite's log filter: every step of a failover, for
    /// reading a failing test.
    pub(crate) fn start(apm: &str, name: &'static str, args: &[&str]) -> Pingpong {
        Self::start_logging(
            apm,
            name,
            args,
            "warn,provider_rxe=info,apm_core=info,apm_core::engine::peer=debug,apm_core::engine::rearm=debug",
        )
    }

    /// Start `apm pingpong` logging with `filter`.
    pub(crate) fn start_logging(
        apm: &str,
        name: &'static str,
        args: &[&str],
        filter: &str,
    ) -> Pingpong {
        // `APM_PINGPONG_LOG` (the benchmark's `--log`) replaces the filter, to trace a run.
        let log = std::env::var("APM_PINGPONG_LOG").unwrap_or_else(|_| filter.to_owned());
        let mut cmd = std::process::Command::new(apm);
        cmd.arg("pingpong").args(args).env("APM_LOG", log);
        Pingpong(ChildLines::spawn(cmd, name, true))
    }

    /// Wait for a stderr line containing `what`; returns when it came.
    pub(crate) fn wait_for(&mut self, what: &str, limit: Duration) -> Instant {
        self.0.wait_for(what, limit).0
    }

    /// Stop sending: close stdin (the run ends once both sides have stopped).
    pub(crate) fn stop(&mut self) {
        self.0.close_stdin();
    }

    /// Wait for the report (JSON on stdout).
    pub(crate) fn finish(mut self, limit: Duration) -> serde_json::Value {
        self.stop();
        self.0.wait_exit(limit);
        let name = self.0.name;
        let out = self.0.child.wait_with_output().expect("wait");
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or("");
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{name}: no JSON report ({e}); stdout: {text}"))
    }
}
