//! `apm run` with hardware APM: unmodified `ibv_rc_pingpong` on the APM-capable
//! soft-RoCE (the VM suite's second phase), through a silent cut and a link down of the
//! rail in use. Nothing tells apm about either: each ends with both QPs migrating by
//! themselves when their retries on the dead rail run out (patched rxe treats an armed
//! QP's packets with nowhere to go as lost, as an HCA does), `PATH_MIG` reaching apm
//! through the async event tee of the program's contexts, and apm arming the rail each
//! left. The program finishes with status 0 on both ends (its destroys do not wait for
//! the events apm read and it never did), and each end's report has a failover made by
//! the device. Without apm the same cut ends the program. Skips on stock rxe (the kernel
//! refuses alternate paths there).

use super::*;

/// Whether rxe0 does hardware APM (the patched modules), or why not.
fn hardware_apm_here() -> Result<(), String> {
    let ctx = verbs().open("rxe0").map_err(|e| e.to_string())?;
    provider_verbs::hw_apm::available(&ctx, 1).map_err(|e| e.to_string())
}

/// The failovers of one end's `--report`: (by the device, in all), and the lost QPs.
fn failovers(report: &str) -> (usize, usize, usize) {
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let processes = v["processes"].as_array().cloned().unwrap_or_default();
    let all: Vec<&serde_json::Value> = processes
        .iter()
        .flat_map(|p| p["failovers"].as_array().into_iter().flatten())
        .collect();
    let by_device = all.iter().filter(|f| f["by"] == "hardware").count();
    let lost = processes
        .iter()
        .map(|p| p["lost"].as_array().map_or(0, Vec::len))
        .sum();
    (by_device, all.len(), lost)
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_run_ibv_rc_pingpong_across_a_silent_cut_and_a_link_down() {
    let Some((apm, _rails)) = prepare("/usr/bin/ibv_rc_pingpong") else {
        return;
    };
    if let Err(why) = hardware_apm_here() {
        return println!("SKIPPED roce_hw_apm_run: no hardware APM on rxe0: {why}");
    }
    // Long enough to span the cut and the migration (the budget, ~0.6 s) and then some.
    let iters = pingpong_iters(18650, 8.0);
    for (cut, port) in [(Cut::SilentUnreported, 18651), (Cut::LinkDown, 18652)] {
        let name = format!("hw-{cut:?}");
        // Without apm the QP has no alternate: the patched rxe errors it when its retries
        // run out (silent cut) or at once (link down), and the program fails.
        let bare = case(
            &name,
            &[pingpong(port, iters)],
            None,
            cut,
            Duration::from_millis(1000),
        );
        assert!(
            !bare.all_ok(),
            "without apm {name} cannot survive the cut:\n{}",
            bare.text
        );
        let out = case(
            &name,
            &[pingpong(port, iters)],
            Some(&apm),
            cut,
            Duration::from_millis(1000),
        );
        assert!(
            out.all_ok(),
            "under apm run with hardware APM both ends end with status 0:\n{}",
            out.text
        );
        for end in ["server0", "client0"] {
            let report = format!("/tmp/{name}-apm-{end}.json");
            let (by_device, all, lost) = failovers(&report);
            println!("  {name} {end}: {all} failovers, {by_device} by hardware APM, {lost} lost");
            assert!(
                by_device >= 1 && lost == 0,
                "{name} {end}: the device moved the QP and nothing was lost ({report}):\n{}",
                out.text
            );
        }
    }
}
