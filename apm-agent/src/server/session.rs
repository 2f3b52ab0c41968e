//! One client's connection: who it is (`SO_PEERCRED`, read once when it connects), its
//! outbox and writer, and its lines read in order and handed to [`super::requests`].

use super::{lock, requests, Client, ClientId, Shared};
use crate::access::Caller;
use crate::hello::HelloSocket;
use crate::outbox::{Drain, Outbox, PROCESS_BUDGET};
use crate::wire::{self, ToAgent};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tracing::{debug, warn};

/// Unreadable lines of one client logged at most (then one line says how many more).
const UNREADABLE_LOGGED: u32 = 3;

/// Take a new connection: refused at once over a cap or when its credentials cannot be
/// read, else served on a task of its own.
pub(super) fn start(
    stream: UnixStream,
    state: &Shared,
    hello: &HelloSocket,
    port: u16,
    max_clients: usize,
) {
    let Ok(cred) = stream.peer_cred() else {
        warn!("a client whose credentials cannot be read: closed");
        return;
    };
    let uid = cred.uid();
    let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
    let (id, drain) = {
        let mut s = lock(state);
        if !s.room_for(uid, max_clients) {
            s.refused_connections += 1;
            return; // dropping the stream closes it
        }
        let caller = Caller::new(uid, cred.gid(), pid, s.uid, s.config.operator_gid);
        s.next_client += 1;
        let id = s.next_client;
        let (outbox, drain) = Outbox::new(PROCESS_BUDGET);
        s.clients.insert(
            id,
            Client {
                caller,
                outbox,
                watcher: false,
                candidates: 0,
                status: None,
            },
        );
        (id, drain)
    };
    debug!(client = id, uid, pid, "a client connected");
    tokio::spawn(serve(id, stream, state.clone(), hello.clone(), port, drain));
}

async fn serve(
    id: ClientId,
    stream: UnixStream,
    state: Shared,
    hello: HelloSocket,
    port: u16,
    drain: Drain,
) {
    let (read, write) = stream.into_split();
    let mut writer = tokio::spawn(write_out(write, drain));
    let mut lines = wire::Lines::new(BufReader::new(read));
    let mut unreadable = 0u32;
    loop {
        let line = tokio::select! {
            l = lines.next_line() => l,
            // The writer ended: the client stopped reading (over its budget) or its
            // socket failed. Either way it is gone.
            _ = &mut writer => break,
        };
        let l = match line {
            Ok(Some(l)) => l,
            Ok(None) => break,
            Err(e) => {
                warn!(client = id, error = %e, "a client's stream is unreadable: closed");
                break;
            }
        };
        match serde_json::from_slice::<ToAgent>(l) {
            Ok(m) => requests::handle(id, m, &state, &hello, port).await,
            Err(e) => {
                unreadable += 1;
                if unreadable <= UNREADABLE_LOGGED {
                    warn!(client = id, error = %e, "an unreadable line from a client: dropped");
                } else if unreadable.is_power_of_two() {
                    warn!(
                        client = id,
                        unreadable, "a client keeps sending unreadable lines"
                    );
                }
            }
        }
    }
    debug!(client = id, "client left");
    let mut s = lock(&state);
    let gone = s.clients.remove(&id);
    super::status::retire(&mut s, gone.as_ref().and_then(|c| c.status.as_deref()));
    s.routes.remove_client(id);
    if let Some(ib) = s.ib.as_mut() {
        ib.forget(id);
    }
    s.refollow();
    drop(s);
    writer.abort();
}

async fn write_out(mut write: OwnedWriteHalf, mut drain: Drain) {
    while let Some(line) = drain.next().await {
        tokio::select! {
            written = write.write_all(&line) => if written.is_err() { return },
            // Over budget while this write waits for a client that does not read.
            () = drain.closed() => return,
        }
    }
    let _ = write.shutdown().await;
}
