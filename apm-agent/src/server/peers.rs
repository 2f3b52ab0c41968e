//! The agent's side toward other hosts: one UDP channel per local address, the
//! messages they receive handed to the process of their connection, and the probe
//! loop.
//!
//! Every channel opens and seals with the agent's one authenticator: a datagram is
//! accepted once per agent, whichever of its addresses (rails) it arrives on, so a
//! capture replayed to another rail is a replay too. Channels exist only for
//! addresses a registration named, which the registration's checks hold to this
//! host's own.

use super::{lock, Shared};
use crate::wire::FromAgent;
use apm_core::{Gid, Input, Lid, PeerAddr, PeerChannel, PeerMsg, PortKey};
use cm_lap::udp::UdpPeerChannel;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info};

/// The UDP channel bound to local address `gid` (created, and started, on first use).
pub(super) async fn channel(
    state: &Shared,
    gid: Gid,
    port: u16,
) -> Result<Arc<UdpPeerChannel>, String> {
    let auth = {
        let s = lock(state);
        if let Some(ch) = s.channels.get(&gid) {
            return Ok(ch.clone());
        }
        s.auth.clone()
    };
    let ip = crate::local::ip_of(&gid).ok_or_else(|| format!("{gid} is not an IP address"))?;
    let ch = UdpPeerChannel::bind(SocketAddr::new(ip, port), PortKey::new(0, 1))
        .await
        .map_err(|e| format!("binding {ip}:{port}: {e}"))?
        .with_authenticator(auth);
    ch.derive_port(port);
    let (tx, mut rx) = mpsc::unbounded_channel::<Input>();
    ch.start(tx).await.map_err(|e| e.to_string())?;
    let ch = Arc::new(ch);
    let routed = state.clone();
    tokio::spawn(async move {
        while let Some(input) = rx.recv().await {
            if let Input::PeerMessage { from, msg, .. } = input {
                route(&routed, from, msg);
            }
        }
    });
    let mut s = lock(state);
    // Another task may have bound it meanwhile (same address twice fails): keep the first.
    Ok(s.channels.entry(gid).or_insert(ch).clone())
}

/// Hand a received peer message to the process that registered its connection (or
/// keep it a moment for one that has not registered yet).
pub(super) fn route(state: &Shared, from: PeerAddr, msg: PeerMsg) {
    let mut s = lock(state);
    if let PeerMsg::Probe(p) = &msg {
        // Probes are the agent's own: a process never sees one.
        if let Some(probes) = s.probes.as_mut() {
            probes.receive(p);
            s.probe_arrived.notify_one();
        }
        return;
    }
    match s.routes.owner(&from, &msg) {
        Some(c) => s.tell(c, &FromAgent::Peer { from, msg }),
        None => {
            let (receiver, sender) = crate::wire::comm_ids(&msg);
            debug!(from = %from.gid, receiver, sender, "peer message for no registered connection: held");
            s.routes.hold(from, msg);
        }
    }
}

/// Run the host's prober: send its probes from the paths' local addresses to the peers'
/// agents, and tell every process of a path its verdicts.
pub(super) async fn probe_loop(state: Shared, port: u16) {
    // New paths are probed within this long even when nothing else is due.
    let idle = Duration::from_millis(50);
    let arrived = lock(&state).probe_arrived.clone();
    loop {
        let wake = {
            let s = lock(&state);
            let Some(p) = s.probes.as_ref() else { return };
            let latest = tokio::time::Instant::now() + idle;
            p.next_wake().map_or(latest, |w| w.min(latest))
        };
        tokio::select! {
            () = tokio::time::sleep_until(wake) => {}
            () = arrived.notified() => {}
        }
        let step = {
            let mut s = lock(&state);
            let Some(p) = s.probes.as_mut() else { return };
            let step = p.step();
            for &(ends, verdict) in &step.verdicts {
                info!(local = %ends.local, remote = %ends.remote, verdict = verdict.name(),
                    kind = verdict.failure().map(|k| k.name()), "probes: path verdict");
                s.tell_verdict(&ends, &FromAgent::Path { ends, verdict });
            }
            step
        };
        for (from, probe) in step.sends {
            let to = PeerAddr {
                gid: probe.ends.remote,
                lid: Lid::from_wire(0),
            };
            match channel(&state, from, port).await {
                Ok(ch) => {
                    if let Err(e) = ch.send(PortKey::new(0, 1), to, PeerMsg::Probe(probe)).await {
                        debug!(error = %e, "probe not sent");
                    }
                }
                Err(e) => debug!(gid = %from, error = %e, "no channel to probe from"),
            }
        }
    }
}
