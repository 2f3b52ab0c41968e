//! `apm agent --explain`: what the host's liveness probes cost and buy, for the paths
//! the running agent probes (or `--paths N`): the budget, the interval it allows, the
//! probes a second, and the time a silent failure takes to be found.

use crate::out::outln;
use anyhow::{bail, Result};
use apm_agent::access::AgentSocket;
use apm_core::probe::{Budget, ProbePolicy};

/// Print the explanation for `paths`, or for the running agent's sessions.
pub(super) async fn explain(
    socket: &AgentSocket,
    policy: &ProbePolicy,
    paths: Option<usize>,
    json: bool,
) -> Result<()> {
    let (paths, source) = match paths {
        Some(n) => (n, "--paths"),
        None => match apm_agent::client::AgentWatch::attach(socket).await {
            Ok(w) => (w.sessions.len(), "the running agent's sessions"),
            Err(e) => bail!(
                "no running agent to ask for its paths ({e}): give --paths N to explain \
                 the budget for N paths"
            ),
        },
    };
    let b = policy.budget(paths);
    if json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            enabled: bool,
            source: &'a str,
            #[serde(flatten)]
            budget: Budget,
        }
        let out = Out {
            enabled: policy.enabled,
            source,
            budget: b,
        };
        return outln!("{}", serde_json::to_string(&out)?);
    }
    outln!("{}", text(policy, &b, source))?;
    Ok(())
}

/// The explanation as a person reads it.
fn text(policy: &ProbePolicy, b: &Budget, source: &str) -> String {
    let ms = |d: std::time::Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let mut out = format!(
        "apm agent --explain: {} path(s) probed ({source})\n",
        b.paths
    );
    if !policy.enabled {
        out.push_str(
            "  probes are off ([policy.probe] enabled = false; --probes turns them on): \
             nothing is sent, and a silent failure is found only by the QPs' retries\n",
        );
    }
    out.push_str(&format!(
        "  budget     {} probes/s per host ([policy.probe] max_probes_per_sec)\n",
        b.max_probes_per_sec
    ));
    let interval = if b.stretched {
        format!(
            "{} ms ([policy.probe] interval_ms), stretched to {} to keep {} paths within the budget",
            policy.interval_ms,
            ms(b.interval),
            b.paths
        )
    } else {
        format!("{} ([policy.probe] interval_ms)", ms(b.interval))
    };
    out.push_str(&format!(
        "  interval   {interval}; {} on a path that is down\n",
        ms(b.down_interval)
    ));
    out.push_str(&format!(
        "  sends      {:.0} probes/s with every path up\n",
        b.probes_per_sec
    ));
    out.push_str(&format!(
        "  detection  a silent failure is found {} to {} after it (multiplier {})",
        ms(b.detection_min),
        ms(b.detection_max),
        policy.multiplier
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_explanation_says_when_the_budget_stretches_the_interval() {
        let p = ProbePolicy {
            enabled: true,
            ..ProbePolicy::default()
        };
        let small = text(&p, &p.budget(16), "--paths");
        assert!(
            small.contains("15.0 ms ([policy.probe] interval_ms);"),
            "{small}"
        );
        assert!(small.contains("30.0 ms to 45.0 ms"), "{small}");
        let big = text(&p, &p.budget(8192), "--paths");
        assert!(
            big.contains("stretched to 1872.5 ms to keep 8192 paths"),
            "{big}"
        );
        assert!(big.contains("sends      5000 probes/s"), "{big}");
        let off = text(&ProbePolicy::default(), &p.budget(2), "--paths");
        assert!(off.contains("probes are off"), "{off}");
    }
}
