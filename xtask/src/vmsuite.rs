//! The VM suite's two phases in one boot, and the stall figure across them.
//!
//! Phase 1 runs the hardware suite (`provider-verbs/tests/hw.rs`) on the stock
//! `rdma_rxe`: software path migration, port events, the C example. Phase 2 swaps in the
//! patched modules of `kernel/rxe-apm` (unload the stock `rdma_rxe`, `ib_uverbs` and
//! `ib_core`, load the patched ones from the image, create the devices again), runs the
//! patch set's own test (`kernel/rxe-apm/test/rxe_apm_test.c`) and then the suite's
//! hardware-APM tests on the APM-capable device. Both phases share one boot, so the
//! stalls they measure (lines `APM-FIGURE <scenario> <mode> <ms>`) are printed side by
//! side at the end.
//!
//! What it must never do: run phase 2 on anything but the patched modules (it checks
//! that each is the out-of-tree one), or hide a phase's failure behind the other's.

use crate::kernel::MODULES;
use crate::vm::shell_quote as quote;
use anyhow::{bail, Result};
use std::fmt::Write as _;

/// The rails of the VM: VLANs 10 and 20 over the veth pair, IPv4 addresses that become
/// RoCE v2 GIDs, per-source routes so that two local addresses talk over the wire
/// (the same layout `setup_rails` in hw.rs makes, idempotent: run again after a link
/// comes back, which drops its routes).
pub const RAILS_SCRIPT: &str = r#"for v in 10 20; do
  for s in A B; do
    d=v$s.$v
    if [ $s = A ] ; then a=10.0.$v.1; else a=10.0.$v.2; fi
    /usr/bin/ip link show $d >/dev/null 2>&1 || {
      /usr/bin/ip link add link v$s name $d type vlan id $v
      /usr/bin/ip addr add $a/24 dev $d
    }
    /usr/bin/ip link set $d up
  done
done
for d in all default vA vB vA.10 vA.20 vB.10 vB.20 lo; do
  echo 0 > /proc/sys/net/ipv4/conf/$d/rp_filter
  echo 1 > /proc/sys/net/ipv4/conf/$d/accept_local
done
/usr/bin/ip rule show | grep -q '^1000:.*lookup local' || /usr/bin/ip rule add pref 1000 lookup local
/usr/bin/ip rule del pref 0 2>/dev/null
for v in 10 20; do
  /usr/bin/ip route replace 10.0.$v.2 dev vA.$v src 10.0.$v.1 table 1$v
  /usr/bin/ip route replace 10.0.$v.1 dev vB.$v src 10.0.$v.2 table 2$v
  /usr/bin/ip rule show | grep -q "from 10.0.$v.1 iif lo lookup 1$v" ||
    /usr/bin/ip rule add pref 100 from 10.0.$v.1 iif lo lookup 1$v
  /usr/bin/ip rule show | grep -q "from 10.0.$v.2 iif lo lookup 2$v" ||
    /usr/bin/ip rule add pref 100 from 10.0.$v.2 iif lo lookup 2$v
done
"#;

/// The hardware suite's tests that phase 2 runs (name filters): the ones that need a
/// device doing hardware APM.
const PATCHED_TESTS: &[&str] = &["ib_hardware_apm", "roce_hw_apm"];

/// The name a filter selects the patch set's own test by.
const PATCH_TEST: &str = "rxe_apm_test";

/// The guest script (run in place of a single test binary): both phases, or with
/// `patched_boot` (the guest booted with `apm.rdma=patched`) phase 2 alone. `filter`
/// narrows each phase (test name substrings): phase 1 runs the suite's tests it selects,
/// phase 2 the hardware-APM tests it selects and the patch set's test if a filter is
/// part of [`PATCH_TEST`]'s name; a phase 2 with nothing selected is skipped, module
/// swap included. With no filter: all of phase 1, and in phase 2 the patch set's test
/// and every hardware-APM test.
pub fn script(modules_key: &str, patched_boot: bool, filter: &[String]) -> String {
    let base = "/mnt/hw --ignored --test-threads=1 --nocapture";
    let words: Vec<String> = filter.iter().map(|f| quote(f)).collect();
    let mut s = String::from(
        "#!/bin/sh\n# The VM suite: stock RDMA modules, then kernel/rxe-apm's.\nstatus=0\n",
    );
    if !patched_boot {
        let _ = writeln!(s, "echo 'APM-PHASE 1: stock rdma_rxe: the hardware suite'");
        let narrowed: String = words.iter().map(|w| format!(" {w}")).collect();
        let _ = writeln!(s, "{base}{narrowed} || status=1");
    }
    // Phase 2's tests: the hardware-APM ones, narrowed by the filter (full names).
    let _ = write!(
        s,
        "tests=$(/mnt/hw --ignored --list 2>/dev/null | sed -n 's/: test$//p' | grep{}",
        PATCHED_TESTS
            .iter()
            .map(|t| format!(" -e {}", quote(t)))
            .collect::<String>()
    );
    if !filter.is_empty() {
        let _ = write!(
            s,
            " | grep -F{}",
            words.iter().map(|w| format!(" -e {w}")).collect::<String>()
        );
    }
    s.push_str(")\n");
    let patch_test = filter.is_empty() || filter.iter().any(|f| PATCH_TEST.contains(f.as_str()));
    if !patch_test {
        s.push_str(
            "if [ -z \"$tests\" ]; then\n  \
               echo 'APM-PHASE 2: skipped: the filter selects none of its tests'\n  \
               exit $status\n\
             fi\n",
        );
    }
    let _ = writeln!(
        s,
        "echo 'APM-PHASE 2: the patched RDMA modules (kernel/rxe-apm, build {modules_key})'"
    );
    // Dependents first: the reverse of the load order.
    let unload: Vec<&str> = MODULES.iter().rev().map(|(m, _)| *m).collect();
    let all: Vec<&str> = MODULES.iter().map(|(m, _)| *m).collect();
    if !patched_boot {
        let _ = write!(
            s,
            "/usr/bin/rdma link delete rxe0; /usr/bin/rdma link delete rxe1\n\
             rmmod {} || {{ echo 'cannot unload the stock modules'; exit 1; }}\n\
             for m in $(grep '^patched/' /modules/order-patched); do\n  \
               insmod /modules/$m || {{ echo \"insmod $m failed\"; exit 1; }}\n\
             done\n\
             /usr/bin/rdma link add rxe0 type rxe netdev vA\n\
             /usr/bin/rdma link add rxe1 type rxe netdev vB\n",
            unload.join(" ")
        );
    }
    let _ = write!(
        s,
        "for m in {}; do\n  \
           t=$(cat /sys/module/$m/taint)\n  \
           case \"$t\" in *O*) ;; *) echo \"$m is not the patched module (taint '$t')\"; exit 1;; esac\n\
         done\n\
         echo 'APM-PHASE 2: loaded the patched {} (out-of-tree taint O)'\n",
        all.join(" "),
        all.join(", ")
    );
    let _ = writeln!(s, "cat > /tmp/rails.sh <<'RAILS'\n{RAILS_SCRIPT}RAILS");
    s.push_str("sh /tmp/rails.sh\n");
    if patch_test {
        s.push_str(
            "echo 'APM-PHASE 2: the patch set test (kernel/rxe-apm/test/rxe_apm_test.c)'\n\
             /mnt/rxe_apm_test rxe0 rxe1 10.0.10.1 10.0.10.2 10.0.20.1 10.0.20.2 \
             vA.10 vA.20 vB.10 vB.20 /tmp/rails.sh || status=1\n\
             echo 'APM-PHASE 2: the patch set test under apm run (its async events pass \
             through the tee of apm run; its own APM is left to it)'\n\
             /mnt/apm run -- /mnt/rxe_apm_test rxe0 rxe1 10.0.10.1 10.0.10.2 10.0.20.1 \
             10.0.20.2 vA.10 vA.20 vB.10 vB.20 /tmp/rails.sh || status=1\n",
        );
    }
    s.push_str(
        "if [ -n \"$tests\" ]; then\n  \
           echo 'APM-PHASE 2: the hardware suite on the APM-capable device'\n  \
           APM_HWTEST_RDMA=patched ",
    );
    let _ = writeln!(s, "{base} --exact $tests || status=1\nfi");
    s.push_str("exit $status\n");
    s
}

/// One measured stall: scenario (`silent-cut`, `link-down`), mode, milliseconds.
#[derive(Debug, Clone, PartialEq)]
struct Stall {
    scenario: String,
    mode: String,
    ms: f64,
}

fn stalls(output: &str) -> Vec<Stall> {
    output
        .lines()
        .filter_map(|l| l.trim().strip_prefix("APM-FIGURE "))
        .filter_map(|rest| {
            let mut it = rest.split_whitespace();
            let (scenario, mode, ms) = (it.next()?, it.next()?, it.next()?);
            Some(Stall {
                scenario: scenario.to_owned(),
                mode: mode.to_owned(),
                ms: ms.parse().ok()?,
            })
        })
        .collect()
}

/// The side-by-side figure of the stalls both phases measured (the longest of each
/// scenario and mode), or an error when a phase measured none.
pub fn figure(output: &str) -> Result<String> {
    let all = stalls(output);
    let modes = [
        ("software", "software migration, stock rxe"),
        ("hardware", "hardware APM, patched rxe"),
    ];
    let scenarios = [
        ("silent-cut", "silent cut (netem loss 100%)"),
        ("link-down", "link down (ip link set down)"),
    ];
    let mut out = format!(
        "stall of apm pingpong, path cut to messages flowing again (ms, longest per side):\n\
         {:<32}{:>32}{:>30}\n",
        "", modes[0].1, modes[1].1
    );
    for (key, label) in scenarios {
        let mut cells = Vec::new();
        for (mode, _) in modes {
            let worst = all
                .iter()
                .filter(|s| s.scenario == key && s.mode == mode)
                .map(|s| s.ms)
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            match worst {
                Some(ms) => cells.push(format!("{ms:.0}")),
                None => bail!("no {mode} stall measured for {key}: a phase did not run"),
            }
        }
        let _ = writeln!(out, "{label:<32}{:>32}{:>30}", cells[0], cells[1]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figure_puts_both_modes_side_by_side() {
        let out = "x\nAPM-FIGURE silent-cut software 742.5\n  APM-FIGURE silent-cut software 700\n\
                   APM-FIGURE link-down software 180\nAPM-FIGURE silent-cut hardware 512\n\
                   APM-FIGURE link-down hardware 40.2\n";
        let f = figure(out).expect("figure");
        assert!(f.contains("silent cut"), "{f}");
        let cut = f
            .lines()
            .find(|l| l.starts_with("silent cut"))
            .expect("row");
        assert!(cut.contains("742") && cut.contains("512"), "{cut}");
        let down = f.lines().find(|l| l.starts_with("link down")).expect("row");
        assert!(down.contains("180") && down.contains("40"), "{down}");
    }

    #[test]
    fn a_missing_phase_is_an_error() {
        assert!(figure("APM-FIGURE silent-cut software 1\n").is_err());
    }

    #[test]
    fn phase_two_runs_the_patch_test_on_checked_modules() {
        let s = script("k1", false, &[]);
        assert!(s.contains("rmmod rdma_rxe rdma_ucm ib_uverbs rdma_cm iw_cm ib_cm ib_core"));
        assert!(!script("k1", true, &[]).contains("rmmod"));
        assert!(s.contains("*O*"));
        assert!(s.contains("/mnt/rxe_apm_test rxe0 rxe1"));
        assert!(s.contains("-e 'roce_hw_apm'"));
        assert!(s.contains("--exact $tests"));
        assert!(!s.contains("skipped"), "{s}");
    }

    #[test]
    fn a_filter_narrows_both_phases() {
        let s = script("k1", false, &["apm_run".into()]);
        assert!(s.contains("--nocapture 'apm_run' || status=1"), "{s}");
        assert!(s.contains("grep -F -e 'apm_run'"), "{s}");
        // Phase 2 is skipped when the filter selects no hardware-APM test...
        assert!(s.contains("skipped: the filter selects none"), "{s}");
        assert!(!s.contains("/mnt/rxe_apm_test"), "{s}");
        // ...and the patch set's test runs when the filter names it.
        let s = script("k1", true, &["rxe_apm".into()]);
        assert!(s.contains("/mnt/rxe_apm_test"), "{s}");
        assert!(!s.contains("skipped"), "{s}");
    }
}
