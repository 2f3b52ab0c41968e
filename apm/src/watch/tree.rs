//! The processes an `--exec` command started, wherever they went: a hook's process
//! group holds what it starts, but a child can leave it (`setsid`); its descendants by
//! parent, read from `/proc`, are what a stop must end too. Each is kept with its start
//! time, so that a PID reused after it exited is never signalled.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;

/// A process, as `/proc/PID/stat` shows it: its PID and start time (clock ticks since
/// boot), which together name it for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Proc {
    pid: i32,
    start: u64,
}

/// Parent and start time from a `/proc/PID/stat` line (the command name, in
/// parentheses, may hold spaces and parentheses: the fields follow the last ')').
fn parse_stat(stat: &str) -> Option<(i32, u64)> {
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 4 of stat is the parent, field 22 the start time; `rest` starts at field 3.
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start))
}

fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, s)| s)
}

/// Every living descendant of `root` (not `root` itself).
pub(super) fn descendants(root: i32) -> Vec<Proc> {
    let mut children: BTreeMap<i32, Vec<Proc>> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((ppid, start)) = parse_stat(&stat) {
            children.entry(ppid).or_default().push(Proc { pid, start });
        }
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for c in children.remove(&p).unwrap_or_default() {
            todo.push(c.pid);
            out.push(c);
        }
    }
    out
}

/// Send `signal` to each process still the one it was.
pub(super) fn signal_all(procs: &[Proc], signal: Signal) {
    for p in procs {
        if start_time(p.pid) == Some(p.start) {
            let _ = kill(Pid::from_raw(p.pid), signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_parse() {
        let line = "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 0 0";
        assert_eq!(parse_stat(line), Some((17, 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_childs_children_are_found_even_in_a_session_of_their_own() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 30 & sleep 30 & wait"])
            .spawn()
            .expect("sh");
        let root = i32::try_from(sh.id()).expect("pid");
        let mut found = Vec::new();
        for _ in 0..100 {
            found = descendants(root);
            if found.len() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(found.len() >= 2, "{found:?}");
        signal_all(&found, Signal::SIGKILL);
        let _ = sh.kill();
        let _ = sh.wait();
        // Gone (or zombies of a reaper elsewhere): nothing signalled by a stale PID.
        signal_all(&found, Signal::SIGKILL);
    }
}
