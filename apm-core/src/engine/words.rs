//! The words a software move ends with, built ahead: the `MigrateAck` answering the
//! peer that asked, or our `Migrate` "moved". `Engine::start_sw_migration` puts the one
//! a move will need on its command (`CommandOp::SoftwareMigrate { announce }`), so that
//! the Manager can send it the moment the QP runs on the new path; `peer.rs` sends the
//! same words when the engine hears of the move.

use super::conn::Responder;
use super::peer::MoveAnswer;
use super::Engine;
use crate::io::{MigrateAck, MigrateIntent, PeerMsg, PeerWord};
use crate::types::{ConnId, Path, PeerAddr};

impl Engine {
    /// The `MigrateAck` of connection `id` saying `answer`.
    pub(super) fn migrate_ack(&self, id: ConnId, answer: MoveAnswer) -> Option<PeerMsg> {
        let c = self.conns.get(&id)?;
        Some(PeerMsg::MigrateAck(MigrateAck {
            sender_comm_id: c.local_comm_id,
            receiver_comm_id: c.remote_comm_id,
            ok: answer == MoveAnswer::Moved,
        }))
    }

    /// The word a software move of `id` to `path` ends with once it succeeds, as
    /// `migrated` sends it: the answer to the peer that asked (`responder`), or our
    /// "moved" over the path (the `Announce` chore). It rides on the move's command so
    /// that a driver can send it the moment the QP runs there: a peer holding its
    /// replay for us waits for exactly this word, and otherwise would wait as well for
    /// our engine to hear of the move and ask for it.
    pub(super) fn word_after_move(
        &self,
        id: ConnId,
        path: Path,
        responder: Option<Responder>,
    ) -> Option<Box<PeerWord>> {
        let (port, to, msg) = match responder {
            Some(r) => (r.port, r.to, self.migrate_ack(id, MoveAnswer::Moved)?),
            None => (
                path.port,
                PeerAddr::far_end(&path),
                self.migrate_msg(id, path, MigrateIntent::Moved)?,
            ),
        };
        Some(Box::new(PeerWord { port, to, msg }))
    }
}
