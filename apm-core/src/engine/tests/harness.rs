//! A two-node test bench: engines A (active) and B (passive) wired back to back.
//!
//! Peer messages from one engine are delivered to the other (or dropped by a filter);
//! QP commands succeed unless a test makes them fail; path queries are answered from a
//! fixed table. Time advances only to the engines' own deadlines, so a run is exact.

use crate::io::*;
use crate::policy::Policy;
use crate::types::*;
use crate::Engine;

pub const DEV: u16 = 0;

/// Node A has ports 1/2 with GIDs ::a1/::a2 and LIDs 1/2; node B ::b1/::b2, LIDs 3/4.
pub fn gid(node: char, port: u8) -> Gid {
    let base: u64 = if node == 'a' { 0xa0 } else { 0xb0 };
    Gid::from_guid(base + u64::from(port))
}

pub fn lid(node: char, port: u8) -> Lid {
    let base = if node == 'a' { 0 } else { 2 };
    Lid::new(base + u16::from(port)).expect("test LIDs are unicast")
}

pub fn port_info(node: char, port: u8) -> PortInfo {
    PortInfo {
        key: PortKey::new(DEV, port),
        gids: vec![gid(node, port)],
        lid: lid(node, port),
        lmc: 0,
        active: true,
        link_layer: LinkLayer::InfiniBand,
    }
}

/// The path from `node`'s port `lp` to the other node's port `rp`.
pub fn path(node: char, lp: u8, rp: u8) -> Path {
    let other = if node == 'a' { 'b' } else { 'a' };
    Path::ib(
        PortKey::new(DEV, lp),
        (lid(node, lp), gid(node, lp)),
        (lid(other, rp), gid(other, rp)),
        Path::MTU_4096,
        Path::ACK_TIMEOUT_67MS,
    )
}

/// The probe session of `path(node, lp, rp)`.
pub fn ends(node: char, lp: u8, rp: u8) -> crate::probe::PathEnds {
    let p = path(node, lp, rp);
    crate::probe::PathEnds {
        local: p.sgid,
        remote: p.dgid,
    }
}

pub fn all_paths(node: char) -> Vec<Path> {
    vec![
        path(node, 1, 1),
        path(node, 2, 2),
        path(node, 1, 2),
        path(node, 2, 1),
    ]
}

/// Connection `n`: A's comm id 0x100+n, B's 0x200+n; QPNs likewise.
pub fn spec(node: char, n: u64, mode: MigrationMode) -> ConnSpec {
    let (role, local, remote) = if node == 'a' {
        (Role::Active, 0x100, 0x200)
    } else {
        (Role::Passive, 0x200, 0x100)
    };
    let n32 = u32::try_from(n).expect("small test ids");
    ConnSpec {
        id: ConnId(n),
        role,
        mode,
        local_qpn: Qpn::new(local + n32).expect("24-bit"),
        remote_qpn: Qpn::new(remote + n32).expect("24-bit"),
        local_comm_id: local + n32,
        remote_comm_id: remote + n32,
        primary: path(node, 1, 1),
        agreed_alternate: None,
        candidates: all_paths(node),
    }
}

/// One engine and everything it emitted.
pub struct Node {
    pub name: char,
    pub engine: Engine,
    /// Every output, in order.
    pub log: Vec<Output>,
    /// Outputs not yet carried out.
    queue: Vec<Output>,
    /// Command names this node's provider refuses.
    pub fail_ops: Vec<&'static str>,
    /// GIDs this node's SA has no path to (down ports).
    pub unreachable: Vec<Gid>,
    /// Connections whose QP a query finds in ERR.
    pub dead_qps: Vec<ConnId>,
    /// Command names this node's provider never answers (until `Pair::release`).
    pub unanswered: Vec<&'static str>,
    /// The commands held unanswered, in the order they came.
    pub held: Vec<Command>,
    /// Moves emitted onto a path the engine knew dead (`Node::check_move`).
    pub dead_moves: Vec<String>,
    /// How this node's device answers REARM and apm's arming write: by default it
    /// arms at once (REARM comes back ARMED).
    pub arming: BenchArming,
}

/// How a bench node's QPs arm after REARM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchArming {
    /// REARM comes back ARMED: no packet needed.
    AtOnce,
    /// REARM comes back REARM; apm may post its arming write.
    ApmPosts,
    /// REARM comes back REARM; apm may not post (the application's QP).
    ByTraffic,
}

impl Node {
    fn new(name: char, policy: Policy) -> Node {
        let mut engine = Engine::new(policy).expect("valid test policy");
        for p in [1, 2] {
            engine.handle_input(Time::ZERO, Input::PortInfo(port_info(name, p)));
        }
        let mut n = Node {
            name,
            engine,
            log: Vec::new(),
            queue: Vec::new(),
            fail_ops: Vec::new(),
            unreachable: Vec::new(),
            dead_qps: Vec::new(),
            unanswered: Vec::new(),
            held: Vec::new(),
            dead_moves: Vec::new(),
            arming: BenchArming::AtOnce,
        };
        n.drain();
        n
    }

    /// Take the engine's outputs, checking every move as it is emitted.
    fn drain(&mut self) {
        while let Some(o) = self.engine.poll_output() {
            self.check_move(&o);
            self.log.push(o.clone());
            self.queue.push(o);
        }
    }

    /// A command that moves a connection (a forced migration, onto the QP's alternate;
    /// a software migration; a probe asking the peer to move) must name a path the
    /// engine holds up at the moment it emits it: drained right after the input that
    /// produced it, nothing has happened since.
    fn check_move(&mut self, out: &Output) {
        let Output::Command(c) = out else {
            return;
        };
        let target = match &c.op {
            CommandOp::ForceMigrate { conn } => {
                self.engine.connection(*conn).and_then(|s| s.alternate)
            }
            CommandOp::SoftwareMigrate { path, .. } => Some(*path),
            CommandOp::SendPeer {
                msg:
                    PeerMsg::Migrate(Migrate {
                        path,
                        intent: MigrateIntent::Probe,
                        ..
                    }),
                ..
            } => Some(*path),
            _ => None,
        };
        if let Some(path) = target.filter(|p| !self.engine.path_up(p)) {
            self.dead_moves.push(format!(
                "{}: {} onto dead path {path}",
                self.name,
                c.op.name()
            ));
        }
    }

    pub fn notifications(&self) -> Vec<NotificationKind> {
        self.log
            .iter()
            .filter_map(|o| match o {
                Output::Notify(n) => Some(n.kind.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn ops(&self) -> Vec<CommandOp> {
        self.log
            .iter()
            .filter_map(|o| match o {
                Output::Command(c) => Some(c.op.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn op_names(&self) -> Vec<&'static str> {
        self.ops().iter().map(|o| o.name()).collect()
    }

    /// How many commands named `name` (`CommandOp::name`) the log holds.
    pub fn op_count(&self, name: &str) -> usize {
        self.ops().iter().filter(|o| o.name() == name).count()
    }

    pub fn sent(&self) -> Vec<PeerMsg> {
        self.ops()
            .into_iter()
            .filter_map(|o| match o {
                CommandOp::SendPeer { msg, .. } => Some(msg),
                _ => None,
            })
            .collect()
    }

    pub fn clear_log(&mut self) {
        self.log.clear();
    }

    pub fn status(&self, n: u64) -> crate::ConnStatus {
        self.engine
            .connection(ConnId(n))
            .expect("connection exists")
    }
}

/// Decides whether to drop a message (destination node, message).
pub type DropFilter = Box<dyn FnMut(char, &PeerMsg) -> bool>;

/// A message in flight between the nodes.
struct Flight {
    to: char,
    from: PeerAddr,
    port: PortKey,
    msg: PeerMsg,
}

/// The bench.
pub struct Pair {
    pub a: Node,
    pub b: Node,
    pub now: Time,
    /// Drops a message when it returns true (direction, message).
    pub drop: DropFilter,
    /// Messages in flight.
    wire: Vec<Flight>,
}

impl Pair {
    pub fn new() -> Pair {
        Pair::with_policy(Policy::default())
    }

    pub fn with_policy(policy: Policy) -> Pair {
        Pair {
            a: Node::new('a', policy.clone()),
            b: Node::new('b', policy),
            now: Time::ZERO,
            drop: Box::new(|_, _| false),
            wire: Vec::new(),
        }
    }

    pub fn node(&mut self, name: char) -> &mut Node {
        if name == 'a' {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    /// Feed an input to one node at the current time.
    pub fn input(&mut self, name: char, input: Input) {
        let now = self.now;
        let n = self.node(name);
        n.engine.handle_input(now, input);
        n.drain();
    }

    /// Protect `spec` on one node at the current time.
    pub fn protect_spec(&mut self, name: char, spec: ConnSpec) {
        let now = self.now;
        let n = self.node(name);
        n.engine.protect(now, spec).expect("protect accepted");
        n.drain();
    }

    /// Protect connection `n` on both sides (hardware mode).
    pub fn protect(&mut self, n: u64) {
        self.protect_mode(n, MigrationMode::Hardware);
    }

    pub fn protect_mode(&mut self, n: u64, mode: MigrationMode) {
        self.protect_spec('a', spec('a', n, mode));
        self.protect_spec('b', spec('b', n, mode));
    }

    /// Carry out queued outputs, deliver messages, and follow deadlines until nothing
    /// is left or `limit` of virtual time has passed.
    pub fn run_for(&mut self, limit_ms: u64) {
        let end = self.now.plus(std::time::Duration::from_millis(limit_ms));
        for _ in 0..100_000 {
            if self.step() {
                continue;
            }
            let next = [self.a.engine.poll_timeout(), self.b.engine.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    let now = self.now;
                    for n in [&mut self.a, &mut self.b] {
                        n.engine.handle_timeout(now);
                        n.drain();
                    }
                }
                _ => {
                    self.now = self.now.max(end);
                    return;
                }
            }
        }
        panic!("the bench did not settle: livelock?");
    }

    /// One round of work; false when there was none.
    fn step(&mut self) -> bool {
        let mut did = false;
        for name in ['a', 'b'] {
            let queue = std::mem::take(&mut self.node(name).queue);
            for out in queue {
                did = true;
                if let Output::Command(cmd) = out {
                    self.execute(name, cmd);
                }
            }
        }
        let wire = std::mem::take(&mut self.wire);
        for f in wire {
            did = true;
            if (self.drop)(f.to, &f.msg) {
                continue;
            }
            self.input(
                f.to,
                Input::PeerMessage {
                    from: f.from,
                    port: f.port,
                    msg: f.msg,
                },
            );
        }
        did
    }

    fn execute(&mut self, name: char, cmd: Command) {
        let node = self.node(name);
        if node.unanswered.contains(&cmd.op.name()) {
            node.held.push(cmd);
            return;
        }
        self.answer(name, cmd);
    }

    /// Answer, as the provider would have, every command `name`'s provider held back.
    pub fn release(&mut self, name: char) {
        let held = std::mem::take(&mut self.node(name).held);
        for cmd in held {
            self.answer(name, cmd);
        }
    }

    fn answer(&mut self, name: char, cmd: Command) {
        let other = if name == 'a' { 'b' } else { 'a' };
        let fail = self.node(name).fail_ops.contains(&cmd.op.name());
        let result = if fail {
            Err(ProviderError::refused(
                Operation::from(&cmd.op),
                Reason::Because("test says no"),
            ))
        } else {
            match &cmd.op {
                CommandOp::SendPeer { port, to, msg } => {
                    let info = port_info(name, port.port);
                    // Deliver to the port of the other node that owns `to.gid`.
                    let dest_port = if to.gid == gid(other, 2) { 2 } else { 1 };
                    self.wire.push(Flight {
                        to: other,
                        from: PeerAddr {
                            gid: info.gids[0],
                            lid: info.lid,
                        },
                        port: PortKey::new(DEV, dest_port),
                        msg: *msg,
                    });
                    Ok(CommandOutcome::Done)
                }
                CommandOp::SetRearm { .. } => Ok(CommandOutcome::MigState(
                    if self.node(name).arming == BenchArming::AtOnce {
                        MigState::Armed
                    } else {
                        MigState::Rearm
                    },
                )),
                CommandOp::ArmingWrite { .. }
                    if self.node(name).arming == BenchArming::ByTraffic =>
                {
                    Err(ProviderError::unsupported("bench", Operation::ArmingWrite))
                }
                CommandOp::QueryQp { conn } => {
                    let node = self.node(name);
                    let status = node.engine.connection(*conn);
                    let dead = node.dead_qps.contains(conn);
                    match status {
                        Some(st) => Ok(CommandOutcome::Qp(QpSnapshot {
                            operational: !dead,
                            mig_state: if st.protection == crate::Protection::Armed {
                                MigState::Armed
                            } else {
                                MigState::Migrated
                            },
                            primary_port: st.primary.port,
                            primary_dlid: st.primary.dlid,
                            primary_dgid: st.primary.dgid,
                        })),
                        None => Err(ProviderError::UnknownConnection(*conn)),
                    }
                }
                CommandOp::ResolvePaths { port, dgid } => {
                    let unreachable = self.node(name).unreachable.contains(dgid);
                    Ok(CommandOutcome::Paths(
                        all_paths(name)
                            .into_iter()
                            .filter(|p| p.port == *port && p.dgid == *dgid && !unreachable)
                            .collect(),
                    ))
                }
                _ => Ok(CommandOutcome::Done),
            }
        };
        self.input(name, Input::CommandDone { id: cmd.id, result });
    }
}

/// Both sides protect connection 1 and are armed; the bench with logs cleared.
/// A software pair, armed on rail 2; with `alive`, both sides' rail-2 sessions are up.
pub fn software_pair(alive: bool) -> Pair {
    let mut p = Pair::new();
    p.protect_mode(1, MigrationMode::Software);
    p.run_for(1000);
    if alive {
        for node in ['a', 'b'] {
            p.input(
                node,
                Input::PathUp {
                    ends: ends(node, 2, 2),
                },
            );
        }
    }
    p.a.clear_log();
    p.b.clear_log();
    p
}

pub fn armed_pair() -> Pair {
    let mut p = Pair::new();
    p.protect(1);
    p.run_for(1000);
    p.a.clear_log();
    p.b.clear_log();
    p
}

pub fn port_event(p: &mut Pair, node: char, port: u8, event: PortEvent) {
    p.input(
        node,
        Input::PortEvent {
            port: PortKey::new(DEV, port),
            event,
        },
    );
}

pub fn qp_event(p: &mut Pair, node: char, n: u64, event: QpEvent) {
    p.input(
        node,
        Input::QpEvent {
            conn: ConnId(n),
            event,
        },
    );
}

/// Both sides armed on `alt_port` (local port number of A's alternate).
pub fn assert_armed(p: &Pair, n: u64, a_alt: Path) {
    let a = p.a.status(n);
    let b = p.b.status(n);
    assert_eq!(a.protection, crate::Protection::Armed, "A: {a:?}");
    assert_eq!(b.protection, crate::Protection::Armed, "B: {b:?}");
    // The route, not the timeout: an alternate carries its own, longer one.
    assert!(
        a.alternate.is_some_and(|x| x.same_route(&a_alt)),
        "A's alternate {:?}, expected {a_alt}",
        a.alternate
    );
    let b_alt = b.alternate.expect("B has an alternate");
    assert_eq!(
        (b_alt.sgid, b_alt.dgid),
        (a_alt.dgid, a_alt.sgid),
        "both ends agree"
    );
}
