//! Hardware APM through provider-verbs' `hw_apm` and its QP facet: on InfiniBand HCAs,
//! or on a RoCE device whose kernel accepts alternate paths (the patched soft-RoCE of
//! `kernel/rxe-apm`, in the VM suite's second phase).

use super::apm_plan::{plan, skip, PathEnd, Plan};
use super::*;

const IB_ACK_TIMEOUT: u8 = 14;

/// Connect `a` and `b` (RESET -> INIT -> RTR -> RTS) as `plan` says: the primary path
/// with the AV and, when `load_alt`, the alternate path with `IBV_QP_ALT_PATH` in
/// INIT->RTR. Migration state stays MIGRATED (no `IBV_QP_PATH_MIG_STATE`).
pub(crate) fn ib_connect(a: &End, b: &End, plan: &Plan, load_alt: bool) {
    for (me, peer, side, my_psn, peer_psn) in
        [(a, b, &plan.a, PSN_A, PSN_B), (b, a, &plan.b, PSN_B, PSN_A)]
    {
        qp_to_init(me, side.primary.port());
        let mut rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: plan.mtu,
            dest_qp_num: peer.qp.qp_num(),
            rq_psn: peer_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: side.primary.av(),
            ..QpAttr::default()
        };
        let mut mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER;
        if load_alt {
            rtr.alt_ah_attr = side.alternate.av();
            rtr.alt_port_num = side.alternate.port();
            rtr.alt_pkey_index = 0;
            rtr.alt_timeout = IB_ACK_TIMEOUT;
            mask = mask | QpAttrMask::ALT_PATH;
        }
        me.qp
            .modify(&rtr, mask)
            .unwrap_or_else(|e| panic!("INIT->RTR (alternate path: {load_alt}): {e}"));
        qp_to_rts(me, my_psn, IB_ACK_TIMEOUT);
    }
}

/// The two ends of `plan` (each with its own context, so each sees its QP's events).
fn ib_ends(v: &Verbs, plan: &Plan) -> (End, End) {
    let open = |n: &str| v.open(n).unwrap_or_else(|e| panic!("open {n}: {e}"));
    (
        End::on_port(open(&plan.a_dev), plan.a.primary.port()),
        End::on_port(open(&plan.b_dev), plan.b.primary.port()),
    )
}

/// Primary and alternate paths of a QP as the device reports them.
fn ib_paths(e: &End) -> (QpAttr, u8) {
    let q =
        e.qp.query(
            QpAttrMask::STATE
                | QpAttrMask::PORT
                | QpAttrMask::AV
                | QpAttrMask::ALT_PATH
                | QpAttrMask::PATH_MIG_STATE,
        )
        .expect("query_qp");
    // Some drivers leave port_num 0 and report the port in the AV (as hw_apm allows).
    let port = if q.port_num != 0 {
        q.port_num
    } else {
        q.ah_attr.port_num
    };
    (q, port)
}

/// Keep traffic going (a few messages each way: packets with MigReq=0) until both QPs
/// report ARMED, within 10 s; returns how long it took.
pub(crate) fn ib_wait_armed(a: &mut End, b: &mut End) -> Duration {
    let start = Instant::now();
    loop {
        let (sa, ma) = hw_apm::query(&a.qp).expect("query a");
        let (sb, mb) = hw_apm::query(&b.qp).expect("query b");
        assert_eq!((sa, sb), (QpState::Rts, QpState::Rts), "a QP left RTS");
        if ma == provider_verbs::ffi::MigState::Armed && mb == provider_verbs::ffi::MigState::Armed
        {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not ARMED within 10 s of REARM (with traffic both ways): a {ma:?}, b {mb:?}"
        );
        exchange(a, b, 4);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The next `kind` event for QP `qpn`, within `limit`, polling (no runtime needed once
/// the stream exists); each poll with nothing to read runs `idle` (e.g. more traffic).
/// Returns how long it took and the other events read meanwhile.
fn ib_wait_event(
    events: &mut provider_verbs::ffi::AsyncEvents,
    kind: AsyncEventKind,
    qpn: u32,
    limit: Duration,
    mut idle: impl FnMut(),
) -> Result<(Duration, Vec<provider_verbs::ffi::AsyncEvent>), Vec<provider_verbs::ffi::AsyncEvent>>
{
    let start = Instant::now();
    let mut others = Vec::new();
    loop {
        match events.try_next().expect("ibv_get_async_event") {
            Some(ev) if ev.kind == kind && ev.element == EventElement::Qp(qpn) => {
                return Ok((start.elapsed(), others));
            }
            Some(ev) => others.push(ev),
            None => {
                if start.elapsed() > limit {
                    return Err(others);
                }
                idle();
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

/// Hardware APM on InfiniBand (or an APM-capable RoCE pair), through provider-verbs'
/// `hw_apm`: arm, forced migration
/// under traffic, `IBV_EVENT_PATH_MIG` on both sides, rearm, and the same back again.
///
/// **Hardware needed**: two active InfiniBand ports (link layer InfiniBand, LIDs assigned
/// by a running subnet manager) on one subnet, on HCAs that advertise
/// `IBV_DEVICE_AUTO_PATH_MIG` (e.g. ConnectX), with a distinct alternate path: either two
/// ports of one HCA cabled to a switch (each QP's alternate leaves through the other
/// port), two HCAs with two ports each, or LMC > 0 (`opensm -l 1`; the alternate uses
/// each port's second LID). Run it with `cargo xtask hwtest` on that machine (the suite
/// runs `--ignored --test-threads=1`). Or two RoCE devices whose kernel accepts alternate
/// paths, with the VM's rails (rail 10 primary, rail 20 alternate): the patched
/// soft-RoCE in the second phase of `cargo xtask hwtest --vm`. Elsewhere — no RDMA, or
/// stock RoCE such as the first phase's rxe pair — it prints one
/// `SKIPPED ib_hardware_apm:` line saying what is missing, and passes.
///
/// What it does: an RC pair connected with the primary path (`IBV_QP_AV`) and the
/// alternate (`IBV_QP_ALT_PATH`) loaded in INIT->RTR; REARM on both (RTS->RTS); numbered
/// messages both ways until `ibv_query_qp` says ARMED on both (REARM -> ARMED needs the
/// peer's MigReq=0 packets). Then, in the middle of a numbered exchange, force MIGRATED
/// on one side (`hw_apm::force_migrated`): that side raises `IBV_EVENT_PATH_MIG`; the
/// peer, ARMED, migrates when the first MigReq=1 packet reaches it on its alternate path
/// and raises its own. Both QPs then report MIGRATED with the old alternate as their
/// primary, and every message arrives once, in order. Rearm (`hw_apm::load_alternate`
/// with the old primary, then `hw_apm::set_rearm`), see ARMED again, and do it all once
/// more forcing the other side, which brings the connection back to its first path.
///
/// Not covered: a migration caused by a real path failure (the PORT_ERR of a pulled
/// cable): the suite never takes down a link on a real machine.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn ib_hardware_apm_arm_forced_migration_path_mig_rearm() {
    const TEST: &str = "ib_hardware_apm";
    let v = verbs();
    let plan = match plan(&v) {
        Ok(p) => p,
        Err(why) => return skip(TEST, &why),
    };
    println!("{TEST}: {}", plan.how);
    let (mut a, mut b) = ib_ends(&v, &plan);
    let rt = runtime();
    // The event streams register with the runtime's reactor; they are then polled.
    let _enter = rt.enter();
    let mut ev_a = a.ctx.async_events().expect("async events a");
    let mut ev_b = b.ctx.async_events().expect("async events b");
    ib_connect(&a, &b, &plan, true);
    exchange(&mut a, &mut b, 100);
    for (e, side) in [(&a, &plan.a), (&b, &plan.b)] {
        let (q, port) = ib_paths(e);
        println!(
            "{} qpn {}: {:?} {:?}, primary {}, alternate {} (port {} dlid {} path bits {})",
            e.ctx.name(),
            e.qp.qp_num(),
            q.qp_state,
            q.path_mig_state,
            side.primary,
            side.alternate,
            q.alt_port_num,
            q.alt_ah_attr.dlid,
            q.alt_ah_attr.src_path_bits
        );
        assert_eq!(q.path_mig_state, provider_verbs::ffi::MigState::Migrated);
        assert!(side.primary.is(&q.ah_attr, port), "primary: {q:?}");
        assert!(
            side.alternate.is(&q.alt_ah_attr, q.alt_port_num)
                && q.alt_port_num == side.alternate.port(),
            "alternate loaded at RTR: {q:?}"
        );
    }
    // Which side forces, and the paths each side has now (primary, alternate).
    let mut paths: [(PathEnd, PathEnd); 2] = [
        (plan.a.primary, plan.a.alternate),
        (plan.b.primary, plan.b.alternate),
    ];
    for (round, forcer) in [(1, 0usize), (2, 1)] {
        if round > 1 {
            // Rearm: the new alternate is the old primary, loaded on both sides before
            // either asks for REARM.
            for (k, e) in [&a, &b].into_iter().enumerate() {
                let alt = hw_apm::AltPath {
                    av: paths[k].1.av(),
                    pkey_index: 0,
                    timeout: IB_ACK_TIMEOUT,
                };
                hw_apm::load_alternate(&e.qp, &alt)
                    .unwrap_or_else(|err| panic!("{}: load alternate: {err}", e.ctx.name()));
            }
        }
        for e in [&a, &b] {
            hw_apm::set_rearm(&e.qp)
                .unwrap_or_else(|err| panic!("{}: set REARM: {err}", e.ctx.name()));
        }
        let t = ib_wait_armed(&mut a, &mut b);
        println!("round {round}: REARM -> ARMED on both sides in {t:?}");
        while let Ok(Some(ev)) = ev_a.try_next() {
            println!("  (a, before the migration) {ev:?}");
        }
        while let Ok(Some(ev)) = ev_b.try_next() {
            println!("  (b, before the migration) {ev:?}");
        }

        // Force MIGRATED on one side with messages in flight both ways.
        let forced_at = std::cell::Cell::new(None);
        exchange_with(&mut a, &mut b, 2000, 1000, |x, y| {
            let e = if forcer == 0 { x } else { y };
            hw_apm::force_migrated(&e.qp)
                .unwrap_or_else(|err| panic!("{}: force MIGRATED: {err}", e.ctx.name()));
            forced_at.set(Some(Instant::now()));
        });
        let forced_at = forced_at.get().expect("the migration was forced");
        let (fe, pe) = if forcer == 0 { (&a, &b) } else { (&b, &a) };
        println!(
            "round {round}: forced MIGRATED on {} qpn {} under traffic; 2000 messages each \
             way, none lost or duplicated",
            fe.ctx.name(),
            fe.qp.qp_num()
        );
        let (fq, pq) = (fe.qp.qp_num(), pe.qp.qp_num());
        let (ev_f, ev_p) = if forcer == 0 {
            (&mut ev_a, &mut ev_b)
        } else {
            (&mut ev_b, &mut ev_a)
        };
        match ib_wait_event(
            ev_f,
            AsyncEventKind::PathMig,
            fq,
            Duration::from_secs(5),
            || {},
        ) {
            Ok((_, others)) => println!(
                "round {round}: IBV_EVENT_PATH_MIG on the forcing side {:?} after the \
                 force (other events: {others:?})",
                forced_at.elapsed()
            ),
            Err(others) => panic!(
                "round {round}: no IBV_EVENT_PATH_MIG for qpn {fq} on the forcing side within \
                 5 s of forcing MIGRATED (events seen: {others:?})"
            ),
        }
        // The peer migrates when the forcing side's MigReq=1 packets reach it on its
        // alternate path: keep messages going until it says so.
        let mut more = 0u64;
        let got = {
            let (a_, b_) = (&mut a, &mut b);
            ib_wait_event(
                ev_p,
                AsyncEventKind::PathMig,
                pq,
                Duration::from_secs(10),
                || {
                    exchange(a_, b_, 4);
                    more += 4;
                },
            )
        };
        match got {
            Ok((_, others)) => println!(
                "round {round}: IBV_EVENT_PATH_MIG on the peer {:?} after the force \
                 ({more} more messages each way; other events: {others:?})",
                forced_at.elapsed()
            ),
            Err(others) => panic!(
                "round {round}: no IBV_EVENT_PATH_MIG for the peer's qpn {pq} within 10 s of \
                 traffic after the force (events seen: {others:?})"
            ),
        }
        // Both now run on what was their alternate path, with nothing armed.
        for (k, e) in [&a, &b].into_iter().enumerate() {
            let (q, port) = ib_paths(e);
            let (old_primary, old_alt) = paths[k];
            println!(
                "round {round}: {} qpn {}: {:?} {:?}, primary {old_alt} (was {old_primary})",
                e.ctx.name(),
                e.qp.qp_num(),
                q.qp_state,
                q.path_mig_state,
            );
            assert_eq!(q.qp_state, QpState::Rts, "{}: still RTS", e.ctx.name());
            assert_eq!(
                q.path_mig_state,
                provider_verbs::ffi::MigState::Migrated,
                "{}: MIGRATED after the migration",
                e.ctx.name()
            );
            assert!(
                old_alt.is(&q.ah_attr, port),
                "{}: the primary is the old alternate: {q:?}",
                e.ctx.name()
            );
            paths[k] = (old_alt, old_primary);
        }
        exchange(&mut a, &mut b, 500);
        println!("round {round}: 500 more messages each way on the new primary");
    }
    // Round 2 forced the other side and moved back: rearm once more and leave it ARMED.
    for (k, e) in [&a, &b].into_iter().enumerate() {
        let alt = hw_apm::AltPath {
            av: paths[k].1.av(),
            pkey_index: 0,
            timeout: IB_ACK_TIMEOUT,
        };
        hw_apm::load_alternate(&e.qp, &alt).expect("load alternate");
    }
    for e in [&a, &b] {
        hw_apm::set_rearm(&e.qp).expect("set REARM");
    }
    let t = ib_wait_armed(&mut a, &mut b);
    println!("{TEST}: rearmed after moving back: ARMED on both in {t:?}; passed");
}

/// The same hardware APM cycle as [`ib_hardware_apm_arm_forced_migration_path_mig_rearm`],
/// driven through apm-core's QP-control facet, [`provider_verbs::VerbsQpControl`]: the
/// engine's commands (`load_alternate`, `set_rearm`, `force_migrate`, `query_qp`) on real
/// QPs, and `IBV_EVENT_PATH_MIG` on both sides arriving as the engine input
/// `QpEvent::PathMigrated` of the right connection.
///
/// **Hardware needed**: as the other InfiniBand test, but the alternate path must use
/// other ports (two ports of one HCA on a switch, or two HCAs with two ports each): the
/// facet builds the alternate with source path bits 0 (the base LID), so an LMC-only
/// alternate cannot be expressed through it and that case is skipped with a note. Run
/// with `cargo xtask hwtest`, or on the patched soft-RoCE of `hwtest --vm`'s second
/// phase (RoCE alternates differ by GID: the facet looks the source GID's index up);
/// without either it prints one `SKIPPED ib_hardware_apm_facet:` line and passes.
///
/// Not covered: the engine's own decision to force a migration, which it takes on a local
/// `PORT_ERR` (or an SA trap 65): a real port cannot be failed from here, so the test
/// issues `force_migrate` itself, as the engine would (after its peer answered the
/// probe). The engine's own sequencing (the probe over the peer channel, the re-arm of
/// the path left) is exercised by `apm pingpong` and the library test of `roce_apm.rs`,
/// not here.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn ib_hardware_apm_through_the_verbs_facet() {
    use apm_core::{ConnId, Input, MigState, Path, QpControl, QpEvent};
    const TEST: &str = "ib_hardware_apm_facet";
    let v = verbs();
    let plan = match plan(&v) {
        Ok(p) => p,
        Err(why) => return skip(TEST, &why),
    };
    if !plan.two_ports {
        return skip(
            TEST,
            &format!(
                "the only alternate path here is through LMC ({}); the facet loads \
                 alternates with source path bits 0, so it needs a second port",
                plan.how
            ),
        );
    }
    println!("{TEST}: {}", plan.how);
    let (mut a, mut b) = ib_ends(&v, &plan);
    ib_connect(&a, &b, &plan, false);
    let facet = provider_verbs::VerbsQpControl::new(vec![a.ctx.clone(), b.ctx.clone()]);
    let (ca, cb) = (ConnId(1), ConnId(2));
    facet.register(ca, a.qp.clone()).expect("register a");
    facet.register(cb, b.qp.clone()).expect("register b");
    // Device indexes as the facet numbers them (by name: both ends may share a device).
    let dev_a = facet.device_index(a.ctx.name()).expect("index a");
    let dev_b = facet.device_index(b.ctx.name()).expect("index b");
    let rt = runtime();
    let (sink, mut inputs) = tokio::sync::mpsc::unbounded_channel();
    rt.block_on(facet.start(sink)).expect("facet start");
    exchange(&mut a, &mut b, 100);
    // Source LIDs as the engine has them from the SA: the port's base LID, plus the path
    // bits where the plan's alternate uses another LID of an LMC range.
    let path = |e: &End, dev: u16, p: PathEnd| {
        let bits = match p {
            PathEnd::Ib { bits, .. } => bits,
            PathEnd::Roce { .. } => 0,
        };
        let slid = e.ctx.query_port(p.port()).expect("query_port").lid + u16::from(bits);
        p.engine_path(dev, slid, plan.mtu.code(), IB_ACK_TIMEOUT)
    };
    // (primary, alternate) of each connection.
    let mut paths: [(Path, Path); 2] = [
        (
            path(&a, dev_a, plan.a.primary),
            path(&a, dev_a, plan.a.alternate),
        ),
        (
            path(&b, dev_b, plan.b.primary),
            path(&b, dev_b, plan.b.alternate),
        ),
    ];
    let conns = [ca, cb];
    // The next PathMigrated input for `conn`, polling with traffic in between.
    let wait_migrated = |inputs: &mut tokio::sync::mpsc::UnboundedReceiver<Input>,
                         conn: ConnId,
                         limit: Duration,
                         idle: &mut dyn FnMut()| {
        let start = Instant::now();
        let mut others = Vec::new();
        loop {
            let got = rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(20), inputs.recv()).await
            });
            match got {
                Ok(Some(Input::QpEvent {
                    conn: c,
                    event: QpEvent::PathMigrated,
                })) if c == conn => return (start.elapsed(), others),
                Ok(Some(i)) => others.push(format!("{i:?}")),
                Ok(None) => panic!("the facet closed its input stream"),
                Err(_) => {
                    assert!(
                        start.elapsed() < limit,
                        "no QpEvent::PathMigrated for {conn:?} within {limit:?} (inputs \
                             seen: {others:?})"
                    );
                    idle();
                }
            }
        }
    };
    for (round, forcer) in [(1, 0usize), (2, 1)] {
        for k in 0..2 {
            rt.block_on(facet.load_alternate(conns[k], paths[k].1))
                .unwrap_or_else(|e| panic!("round {round}: load_alternate {:?}: {e}", conns[k]));
        }
        for c in conns {
            let m = rt
                .block_on(facet.set_rearm(c))
                .unwrap_or_else(|e| panic!("round {round}: set_rearm {c:?}: {e}"));
            println!("round {round}: set_rearm {c:?} -> {m:?}");
            assert!(matches!(m, MigState::Rearm | MigState::Armed), "{m:?}");
        }
        let start = Instant::now();
        loop {
            let sa = rt.block_on(facet.query_qp(ca)).expect("query_qp a");
            let sb = rt.block_on(facet.query_qp(cb)).expect("query_qp b");
            if sa.mig_state == MigState::Armed && sb.mig_state == MigState::Armed {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "round {round}: not ARMED within 10 s: {sa:?} {sb:?}"
            );
            exchange(&mut a, &mut b, 4);
        }
        println!(
            "round {round}: ARMED through the facet in {:?}",
            start.elapsed()
        );
        // Drop what the arming produced (e.g. COMM_EST) before the migration.
        while let Ok(i) = inputs.try_recv() {
            println!("  (before the migration) {i:?}");
        }
        exchange_with(&mut a, &mut b, 1000, 500, |_, _| {
            rt.block_on(facet.force_migrate(conns[forcer]))
                .unwrap_or_else(|e| panic!("round {round}: force_migrate: {e}"));
        });
        let (t, others) = wait_migrated(
            &mut inputs,
            conns[forcer],
            Duration::from_secs(5),
            &mut || {},
        );
        println!(
            "round {round}: forced {:?}: PathMigrated input {t:?} after the exchange (also: \
             {others:?})",
            conns[forcer]
        );
        let peer = 1 - forcer;
        let (t, others) = {
            let (a_, b_) = (&mut a, &mut b);
            wait_migrated(
                &mut inputs,
                conns[peer],
                Duration::from_secs(10),
                &mut || exchange(a_, b_, 4),
            )
        };
        println!(
            "round {round}: the peer {:?}: PathMigrated input after {t:?} of traffic (also: \
             {others:?})",
            conns[peer]
        );
        for k in 0..2 {
            let snap = rt.block_on(facet.query_qp(conns[k])).expect("query_qp");
            println!("round {round}: {:?} {snap:?}", conns[k]);
            let (old_primary, old_alt) = paths[k];
            assert!(snap.operational, "{:?} operational", conns[k]);
            assert_eq!(snap.mig_state, MigState::Migrated, "{:?}", conns[k]);
            assert_eq!(
                (snap.primary_port, snap.primary_dlid, snap.primary_dgid),
                (old_alt.port, old_alt.dlid, old_alt.dgid),
                "{:?}: the primary is the old alternate",
                conns[k]
            );
            paths[k] = (old_alt, old_primary);
        }
        exchange(&mut a, &mut b, 200);
    }
    println!("{TEST}: two forced migrations and rearms through the facet; passed");
}
