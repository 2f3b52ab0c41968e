//! What reaches the program's protection from outside its calls: each device engine's
//! notifications, into the report and the connections' primaries ([`watch`]), and the
//! agent's messages, to the engine of the connection they name ([`dispatch`]).

use super::{live, lock, Device};
use crate::mode::Facet;
use crate::report;
use apm_agent::report::MovedBy;
use apm_agent::wire::FromAgent;
use apm_core::{Cause, ConnId, NotificationKind};
use std::sync::Arc;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Follow one device's notifications into the report and the connections' primaries.
pub(super) async fn watch(dev: Arc<Device>) {
    let mut notes = dev.handle.notifications();
    loop {
        let n = match notes.recv().await {
            Ok(n) => n,
            Err(tokio::sync::broadcast::error::RecvError::Lagged(k)) => {
                warn!(k, "apm missed notifications");
                continue;
            }
            Err(_) => return,
        };
        let Some(conn) = lock(&dev.conns).get(&n.conn).cloned() else {
            continue;
        };
        match n.kind {
            NotificationKind::Protected { .. } | NotificationKind::Rearmed { .. } => {
                report::protected(conn.qpn, &dev.name, !conn.protected_once);
                if let Some(c) = lock(&dev.conns).get_mut(&n.conn) {
                    c.protected_once = true;
                }
            }
            NotificationKind::Migrated { primary, cause, .. } => {
                if let Some(c) = lock(&dev.conns).get_mut(&n.conn) {
                    c.primary = primary;
                }
                let (took, by) = match &dev.facet {
                    Facet::Software(f) => (
                        f.adopted(n.conn)
                            .and_then(|a| a.last_move())
                            .map(|d| d.as_secs_f64() * 1000.0),
                        MovedBy::Software,
                    ),
                    // The device moved it: no move of apm's to time.
                    Facet::Hardware(_) => (None, MovedBy::Hardware),
                };
                report::failover(
                    conn.qpn,
                    &dev.name,
                    took,
                    primary.to_string(),
                    by,
                    cause.map(Cause::name),
                );
            }
            NotificationKind::Unprotected { reason, .. } => {
                debug!(qpn = conn.qpn, ?reason, "unprotected");
                report::unprotected(conn.qpn, &dev.name, reason.into());
            }
            NotificationKind::Lost { reason } => {
                report::lost(conn.qpn, &dev.name, &format!("{reason:?}"));
            }
            _ => {}
        }
    }
}

/// What the agent sends: peer messages to the right engine, rail-down verdicts, its end.
pub(super) async fn dispatch(mut events: mpsc::UnboundedReceiver<FromAgent>) {
    while let Some(ev) = events.recv().await {
        let Some(p) = live() else {
            continue;
        };
        let devices: Vec<Arc<Device>> = lock(&p.started).clone();
        match ev {
            FromAgent::Peer { from, msg } => {
                // Devices number their QPs alike: the whole identity decides.
                let (local, remote) = apm_agent::wire::comm_ids(&msg);
                let owner = devices.iter().find_map(|d| {
                    let mut conns = lock(&d.conns);
                    let c = conns.values_mut().find(|c| c.owns(local, remote, &from))?;
                    // Kept until the engine knows the connection, or handed over now.
                    Some((d, c.take(from, msg)))
                });
                match owner {
                    Some((d, Some((from, msg)))) => {
                        d.peer.deliver(from, msg);
                    }
                    Some((_, None)) => debug!(
                        local,
                        remote, "peer message kept until its engine knows the connection"
                    ),
                    None => {
                        debug!(local, remote, from = %from.gid, "peer message for no connection here")
                    }
                }
            }
            FromAgent::RailDown { gid } => {
                for d in &devices {
                    let hit: Vec<ConnId> = lock(&d.conns)
                        .iter()
                        .filter(|(_, c)| c.primary.sgid == gid || c.primary.dgid == gid)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in hit {
                        info!(%id, %gid, "rail down under the primary: moving");
                        let _ = d.handle.report_stall(id).await;
                    }
                }
            }
            FromAgent::Path { ends, verdict } => {
                info!(local = %ends.local, remote = %ends.remote, verdict = verdict.name(),
                    kind = verdict.failure().map(|k| k.name()), "the agent's probes: path");
                for d in &devices {
                    let _ = d.handle.path_health(ends, verdict);
                }
            }
            // The client keeps the answers to its own requests.
            FromAgent::Refused { what } => {
                warn!(%what, "the apm agent refused a request");
                report::note(&format!("the apm agent refused: {what}"));
            }
            // The SA's notices (traps 64/65) the agent fans out: every InfiniBand
            // engine here judges them against its own connections' paths.
            FromAgent::RemoteGid { gid, service } => {
                for d in &devices {
                    if let super::Paths::InfiniBand(fabric, _) = &d.paths {
                        fabric.deliver(gid, service);
                    }
                }
            }
            // The client keeps the answers to its own requests.
            FromAgent::Candidates { .. }
            | FromAgent::Paths { .. }
            | FromAgent::Synced { .. }
            | FromAgent::Status { .. }
            | FromAgent::Watching { .. } => {}
        }
    }
    // The agent went away: no peer messages any more. Connections run on unprotected.
    report::note(
        "the apm agent of this host went away: the program's connections run on unprotected",
    );
    if let Some(p) = live() {
        let devices = lock(&p.started).clone();
        for d in devices {
            let ids: Vec<ConnId> = lock(&d.conns).keys().copied().collect();
            for id in ids {
                let _ = d.handle.unprotect(id).await;
            }
        }
    }
}
