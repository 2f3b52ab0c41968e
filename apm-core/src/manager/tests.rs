//! The driver against a mocked provider, in tokio's paused (virtual) time.

use super::*;
use crate::probe::FailureKind;
use crate::provider::MockProvider;
use std::sync::Mutex;

fn port(p: u8) -> PortInfo {
    PortInfo {
        key: PortKey::new(0, p),
        gids: vec![Gid::from_guid(0xa0 + u64::from(p))],
        lid: Lid::new(u16::from(p)).expect("unicast"),
        lmc: 0,
        active: true,
        link_layer: LinkLayer::InfiniBand,
    }
}

fn path(p: u8) -> Path {
    Path::ib(
        PortKey::new(0, p),
        (
            Lid::new(u16::from(p)).expect("unicast"),
            Gid::from_guid(0xa0 + u64::from(p)),
        ),
        (
            Lid::new(10 + u16::from(p)).expect("unicast"),
            Gid::from_guid(0xb0 + u64::from(p)),
        ),
        Path::MTU_4096,
        Path::ACK_TIMEOUT_67MS,
    )
}

fn spec() -> ConnSpec {
    ConnSpec {
        id: ConnId(7),
        role: Role::Active,
        mode: MigrationMode::Hardware,
        local_qpn: Qpn::new(0x11).expect("24-bit"),
        remote_qpn: Qpn::new(0x22).expect("24-bit"),
        local_comm_id: 1,
        remote_comm_id: 2,
        primary: path(1),
        agreed_alternate: Some(path(2)),
        candidates: vec![],
    }
}

/// A mock that hands out ports at start, keeps the sink, and records every command.
/// Its peer answers a probe (`Migrate` asking it to move first) by moving.
/// `watch` sees every command as it is carried out.
fn mock(
    sink: Arc<Mutex<Option<InputSink>>>,
    ops: Arc<Mutex<Vec<CommandOp>>>,
    watch: impl Fn(&CommandOp) + Send + Sync + 'static,
) -> MockProvider {
    let mut m = MockProvider::new();
    let started = sink.clone();
    m.expect_start().returning(move |s| {
        for p in [1, 2] {
            s.send(Input::PortInfo(port(p))).expect("driver listens");
        }
        *started.lock().expect("not poisoned") = Some(s);
        Ok(())
    });
    let silent = Arc::clone(&SILENT_PORT_1);
    let answers = sink.clone();
    m.expect_execute().returning(move |op| {
        watch(&op);
        ops.lock().expect("not poisoned").push(op.clone());
        // The peer's prober: answers every probe at once (a quicker peer than BFD's
        // own schedule, which changes nothing here), except on port 1 once that path
        // goes silent.
        if let CommandOp::SendPeer {
            port,
            to,
            msg: PeerMsg::Probe(p),
        } = &op
        {
            if port.port == 1 && silent.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(CommandOutcome::Done);
            }
            let answer = crate::probe::Probe {
                state: match p.state {
                    crate::probe::SessionState::Down => crate::probe::SessionState::Init,
                    _ => crate::probe::SessionState::Up,
                },
                my_disc: 77,
                your_disc: p.my_disc,
                ends: p.ends.reversed(),
                ..*p
            };
            let input = Input::PeerMessage {
                from: *to,
                port: *port,
                msg: PeerMsg::Probe(answer),
            };
            if let Some(s) = answers.lock().expect("not poisoned").as_ref() {
                let _ = s.send(input);
            }
            return Ok(CommandOutcome::Done);
        }
        if let CommandOp::SendPeer {
            port,
            msg: PeerMsg::Migrate(m),
            ..
        } = &op
        {
            let answer = Input::PeerMessage {
                from: PeerAddr::far_end(&m.path),
                port: *port,
                msg: PeerMsg::MigrateAck(MigrateAck {
                    sender_comm_id: m.receiver_comm_id,
                    receiver_comm_id: m.sender_comm_id,
                    ok: true,
                }),
            };
            if let Some(s) = sink.lock().expect("not poisoned").as_ref() {
                // The driver listens while it runs.
                let _ = s.send(answer);
            }
        }
        Ok(match op {
            CommandOp::SetRearm { .. } => CommandOutcome::MigState(MigState::Armed),
            _ => CommandOutcome::Done,
        })
    });
    m.expect_name().return_const("mock".to_string());
    m
}

/// A Manager on the recording mock, spawned, its streams subscribed before it runs.
struct Running {
    handle: ManagerHandle,
    notes: broadcast::Receiver<Notification>,
    events: broadcast::Receiver<FabricEvent>,
    sink: Arc<Mutex<Option<InputSink>>>,
    ops: Arc<Mutex<Vec<CommandOp>>>,
    task: tokio::task::JoinHandle<Result<(), ManagerError>>,
}

/// Whether the mock's peer has stopped answering probes on port 1 (one test sets it;
/// the others never run probes).
static SILENT_PORT_1: std::sync::LazyLock<Arc<std::sync::atomic::AtomicBool>> =
    std::sync::LazyLock::new(|| Arc::new(std::sync::atomic::AtomicBool::new(false)));

/// The default policy without probes (their sends would crowd the command log).
fn no_probes() -> Policy {
    let mut p = Policy::default();
    p.probe.enabled = false;
    p
}

fn start() -> Running {
    start_with(no_probes())
}

fn start_with(policy: Policy) -> Running {
    start_watched(policy, |_| {})
}

fn start_watched(policy: Policy, watch: impl Fn(&CommandOp) + Send + Sync + 'static) -> Running {
    let sink = Arc::new(Mutex::new(None));
    let ops = Arc::new(Mutex::new(Vec::new()));
    let provider = Arc::new(mock(sink.clone(), ops.clone(), watch));
    let (manager, handle) = Manager::new(provider, policy).expect("valid");
    let notes = handle.notifications();
    let events = handle.fabric_events();
    let task = tokio::spawn(manager.run());
    Running {
        handle,
        notes,
        events,
        sink,
        ops,
        task,
    }
}

#[tokio::test(start_paused = true)]
async fn protect_loads_arms_and_notifies_then_port_err_forces_migration() {
    let Running {
        handle,
        mut notes,
        mut events,
        sink,
        ops,
        task,
    } = start();
    // No waiting: the ports reported at start reach the engine before any API call.
    handle.protect(spec()).await.expect("accepted");
    let n = notes.recv().await.expect("a notification");
    assert!(
        matches!(n.kind, NotificationKind::Protected { alternate, .. } if alternate.same_route(&path(2)))
    );
    let names: Vec<_> = ops.lock().expect("ok").iter().map(|o| o.name()).collect();
    assert_eq!(
        names,
        ["subscribe", "subscribe", "load_alternate", "set_rearm"]
    );

    // A PORT_ERR pushed by the provider reaches the engine; the driver forces migration.
    let s = sink.lock().expect("ok").clone().expect("started");
    s.send(Input::PortEvent {
        port: PortKey::new(0, 1),
        event: PortEvent::Down,
    })
    .expect("driver listens");
    let n = notes.recv().await.expect("a notification");
    assert!(
        matches!(n.kind, NotificationKind::Migrated { forced: true, .. }),
        "{n:?}"
    );
    let ev = events.recv().await.expect("the port event is published");
    assert_eq!(
        ev.kind,
        FabricEventKind::Port {
            port: PortKey::new(0, 1),
            event: PortEvent::Down
        }
    );
    assert!(ops
        .lock()
        .expect("ok")
        .iter()
        .any(|o| o.name() == "force_migrate"));
    let status = handle
        .status(ConnId(7))
        .await
        .expect("running")
        .expect("known");
    assert!(status.primary.same_route(&path(2)), "{}", status.primary);

    // API misuse is reported, not fatal.
    assert!(matches!(
        handle.protect(spec()).await,
        Err(ManagerError::Engine(_))
    ));
    handle.shutdown();
    task.await.expect("joined").expect("clean stop");
    assert!(matches!(
        handle.protect(spec()).await,
        Err(ManagerError::Stopped)
    ));
}

#[tokio::test(start_paused = true)]
async fn probes_run_per_path_and_a_silent_primary_moves_the_connection() {
    let Running {
        handle,
        mut notes,
        mut events,
        ops,
        ..
    } = start_with({
        // The mock's ports are InfiniBand ones, probed only on request.
        let mut p = Policy::default();
        p.probe.enabled = true;
        p.probe.infiniband = true;
        p
    });
    // No waiting: the ports reported at start reach the engine before any API call.
    handle.protect(spec()).await.expect("accepted");
    let n = notes.recv().await.expect("protected");
    assert!(
        matches!(n.kind, NotificationKind::Protected { .. }),
        "{n:?}"
    );
    // Both paths' sessions come up: each was probed and answered.
    let mut up = std::collections::BTreeSet::new();
    while up.len() < 2 {
        let ev = events
            .recv()
            .await
            .expect("the sessions' verdicts are published");
        match ev.kind {
            FabricEventKind::Path {
                ends,
                verdict: crate::probe::PathVerdict::Up,
            } => {
                up.insert(ends.remote);
            }
            FabricEventKind::PortInfo(_) => {}
            other => panic!("a session's first Up expected, got {other:?}"),
        }
    }
    let probed: std::collections::BTreeSet<Gid> = ops
        .lock()
        .expect("ok")
        .iter()
        .filter_map(|o| match o {
            CommandOp::SendPeer {
                to,
                msg: PeerMsg::Probe(_),
                ..
            } => Some(to.gid),
            _ => None,
        })
        .collect();
    assert_eq!(probed, [path(1).dgid, path(2).dgid].into_iter().collect());

    // The primary's path goes silent with both ports up: found within 3 x 15 ms
    // (plus one interval), a fabric failure, and the connection moves.
    SILENT_PORT_1.store(true, std::sync::atomic::Ordering::SeqCst);
    let cut = tokio::time::Instant::now();
    // The events so far: the ports (each session's first Up was read above).
    let ev = loop {
        let ev = events.recv().await.expect("the probe verdict is published");
        match ev.kind {
            FabricEventKind::PortInfo(_)
            | FabricEventKind::Path {
                verdict: PathVerdict::Up,
                ..
            } => continue,
            _ => break ev,
        }
    };
    assert_eq!(
        ev.kind,
        FabricEventKind::Path {
            ends: PathEnds {
                local: path(1).sgid,
                remote: path(1).dgid
            },
            verdict: PathVerdict::Down {
                kind: FailureKind::Fabric
            },
        }
    );
    let n = notes.recv().await.expect("migrated");
    assert!(
        matches!(
            n.kind,
            NotificationKind::Migrated {
                forced: true,
                cause: Some(Cause::Fabric),
                ..
            }
        ),
        "the application hears the kind: {n:?}"
    );
    assert!(
        cut.elapsed() <= std::time::Duration::from_millis(85),
        "{:?}",
        cut.elapsed()
    );
    SILENT_PORT_1.store(false, std::sync::atomic::Ordering::SeqCst);
}

#[tokio::test(start_paused = true)]
async fn a_stall_the_application_reports_forces_the_migration() {
    let Running {
        handle,
        mut notes,
        ops,
        ..
    } = start();
    // No waiting: the ports reported at start reach the engine before any API call.
    handle.protect(spec()).await.expect("accepted");
    let n = notes.recv().await.expect("protected");
    assert!(
        matches!(n.kind, NotificationKind::Protected { .. }),
        "{n:?}"
    );
    assert!(matches!(
        handle.report_stall(ConnId(9)).await,
        Err(ManagerError::Engine(EngineError::UnknownConnection(
            ConnId(9)
        )))
    ));
    handle
        .report_stall(spec().id)
        .await
        .expect("known connection");
    let n = notes.recv().await.expect("migrated");
    assert!(
        matches!(
            n.kind,
            NotificationKind::Migrated {
                forced: true,
                cause: Some(Cause::Stall),
                ..
            }
        ),
        "{n:?}"
    );
    let forced = ops
        .lock()
        .expect("ok")
        .iter()
        .any(|o| matches!(o, CommandOp::ForceMigrate { .. }));
    assert!(forced, "the HCA was told to migrate");
}

#[tokio::test(start_paused = true)]
async fn an_outside_prober_s_verdict_moves_the_connection_and_is_published() {
    // `apm run`'s processes: the host's agent probes, the process's Manager does not.
    let Running {
        handle,
        mut notes,
        mut events,
        ..
    } = start();
    handle.protect(spec()).await.expect("accepted");
    let n = notes.recv().await.expect("protected");
    assert!(
        matches!(n.kind, NotificationKind::Protected { .. }),
        "{n:?}"
    );
    let ends = PathEnds {
        local: path(1).sgid,
        remote: path(1).dgid,
    };
    let down = PathVerdict::Down {
        kind: FailureKind::PeerPort,
    };
    handle.path_health(ends, down).expect("running");
    let n = notes.recv().await.expect("migrated");
    assert!(
        matches!(
            n.kind,
            NotificationKind::Migrated {
                cause: Some(Cause::PeerPort),
                ..
            }
        ),
        "{n:?}"
    );
    let ev = loop {
        let ev = events.recv().await.expect("published");
        if matches!(ev.kind, FabricEventKind::Path { .. }) {
            break ev;
        }
    };
    assert_eq!(
        ev.kind,
        FabricEventKind::Path {
            ends,
            verdict: down
        }
    );
    // A hold counts from when this Manager hears it.
    let held = PathVerdict::Held { hold_ms: 6_000 };
    handle.path_health(ends, held).expect("running");
    let ev = events.recv().await.expect("published");
    assert_eq!(
        ev.kind,
        FabricEventKind::Path {
            ends,
            verdict: held
        }
    );
}

#[tokio::test(start_paused = true)]
async fn provider_start_failure_is_reported() {
    let mut m = MockProvider::new();
    m.expect_start().returning(|_| {
        Err(ProviderError::Unavailable {
            library: "libibverbs.so.1",
            package: "libibverbs1",
        })
    });
    let (manager, _handle) = Manager::new(Arc::new(m), Policy::default()).expect("valid");
    let err = manager.run().await.expect_err("start fails");
    assert!(err.to_string().contains("libibverbs1"), "{err}");
}

/// A provider whose QP loads never return (a wedged device call); it reports every
/// call it gets.
struct NeverAnswers {
    calls: mpsc::UnboundedSender<&'static str>,
}

#[async_trait::async_trait]
impl Provider for NeverAnswers {
    fn name(&self) -> String {
        "never-answers".into()
    }
    async fn start(&self, sink: InputSink) -> Result<(), ProviderError> {
        for p in [1, 2] {
            sink.send(Input::PortInfo(port(p))).expect("driver listens");
        }
        Ok(())
    }
    async fn execute(&self, op: CommandOp) -> Result<CommandOutcome, ProviderError> {
        let _ = self.calls.send(op.name());
        match op {
            CommandOp::LoadAlternate { .. } => std::future::pending().await,
            _ => Ok(CommandOutcome::Done),
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_provider_call_that_never_returns_fails_at_the_deadline() {
    let (calls, mut called) = mpsc::unbounded_channel();
    let provider = Arc::new(NeverAnswers { calls });
    let (manager, handle) = Manager::new(provider, Policy::default()).expect("valid");
    let mut notes = handle.notifications();
    let task = tokio::spawn(manager.run());
    handle.protect(spec()).await.expect("accepted");
    let n = notes.recv().await.expect("a notification");
    assert_eq!(
        n.kind,
        NotificationKind::Unprotected {
            reason: UnprotectedReason::ModifyFailed,
            cause: None
        }
    );
    assert_eq!(
        n.time,
        Time::from_millis(Policy::default().command_timeout_ms)
    );
    // Not wedged: the manager answers and goes on issuing commands.
    let status = handle.status(ConnId(7)).await.expect("running");
    assert_eq!(
        status.map(|s| s.protection),
        Some(crate::Protection::Unprotected)
    );
    // And the provider is called again after the stuck load.
    let mut seen = Vec::new();
    while !seen.contains(&"load_alternate") {
        seen.push(called.recv().await.expect("the provider is called"));
    }
    let next = called.recv().await.expect("a call after the stuck one");
    assert!(!next.is_empty(), "{seen:?} then {next}");
    handle.shutdown();
    task.await.expect("joined").expect("clean stop");
}

#[tokio::test(start_paused = true)]
async fn deadlines_fire_in_virtual_time() {
    // No APR ever comes: after lap_max_tries the connection is reported unprotected,
    // 1.5 s of virtual time later, with no real waiting.
    let Running {
        handle,
        mut notes,
        ops,
        ..
    } = start();
    let mut s = spec();
    s.agreed_alternate = None;
    s.candidates = vec![path(2)];
    handle.protect(s).await.expect("accepted");
    let n = notes.recv().await.expect("a notification");
    assert!(
        matches!(
            n.kind,
            NotificationKind::Unprotected {
                reason: UnprotectedReason::PeerUnresponsive,
                cause: None
            }
        ),
        "{n:?}"
    );
    assert_eq!(n.time, Time::from_millis(1500));
    let laps = ops
        .lock()
        .expect("ok")
        .iter()
        .filter(|o| {
            matches!(
                o,
                CommandOp::SendPeer {
                    msg: PeerMsg::Lap(_),
                    ..
                }
            )
        })
        .count();
    assert_eq!(laps, 4);
}

/// Whether `op` sends our "moved".
fn sends_moved(op: &CommandOp) -> bool {
    matches!(
        op,
        CommandOp::SendPeer {
            msg: PeerMsg::Migrate(Migrate {
                intent: MigrateIntent::Moved,
                ..
            }),
            ..
        }
    )
}

#[tokio::test(start_paused = true)]
async fn a_software_move_sends_its_word_before_the_engine_hears_of_it_and_once() {
    // What the application had been told when the "moved" went out: the engine tells
    // it of the move when it hears the move's result.
    let told: Arc<Mutex<Option<broadcast::Receiver<Notification>>>> = Arc::default();
    let migrated_before_word: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (t, m) = (Arc::clone(&told), Arc::clone(&migrated_before_word));
    let Running {
        handle,
        mut notes,
        sink,
        ops,
        ..
    } = start_watched(no_probes(), move |op| {
        if sends_moved(op) {
            let mut rx = t.lock().expect("ok");
            let rx = rx.as_mut().expect("subscribed before the fault");
            let mut migrated = false;
            while let Ok(n) = rx.try_recv() {
                migrated |= matches!(n.kind, NotificationKind::Migrated { .. });
            }
            m.lock().expect("ok").push(migrated);
        }
    });
    let mut s = spec();
    s.mode = MigrationMode::Software;
    handle.protect(s).await.expect("accepted");
    let n = notes.recv().await.expect("protected");
    assert!(
        matches!(n.kind, NotificationKind::Protected { .. }),
        "{n:?}"
    );
    *told.lock().expect("ok") = Some(handle.notifications());
    // The primary's port dies: the engine asks the peer to move first, the mock's peer
    // moves, and our side follows it (a software move whose word is our "moved").
    let s = sink.lock().expect("ok").clone().expect("started");
    s.send(Input::PortEvent {
        port: PortKey::new(0, 1),
        event: PortEvent::Down,
    })
    .expect("driver listens");
    let n = notes.recv().await.expect("migrated");
    assert!(matches!(n.kind, NotificationKind::Migrated { .. }), "{n:?}");
    // Let the engine ask for its own "moved" (the Announce after the move).
    tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    let ops = ops.lock().expect("ok").clone();
    let at = ops
        .iter()
        .position(|o| matches!(o, CommandOp::SoftwareMigrate { .. }))
        .expect("a software move");
    // The provider moves the QP and never sees the word...
    assert!(
        matches!(&ops[at], CommandOp::SoftwareMigrate { announce: None, path: to, .. } if to.same_route(&path(2))),
        "{:?}",
        ops[at]
    );
    // ...which goes out right behind the move, before the engine has heard of the move,
    // and once: the engine's own copy is answered without being sent again.
    assert!(ops.get(at + 1).is_some_and(sends_moved), "{ops:?}");
    assert_eq!(*migrated_before_word.lock().expect("ok"), [false]);
    let stats = handle.stats().await.expect("running");
    assert!(stats.migrate_msgs_sent >= 2, "{stats:?}");
}
