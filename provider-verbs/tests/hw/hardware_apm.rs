//! Hardware APM through provider-verbs' `hw_apm` and its QP facet: on InfiniBand HCAs,
//! or on a RoCE device whose kernel accepts alternate paths (the patched soft-RoCE of
//! `kernel/rxe-apm`, in the VM suite's second phase).

use super::*;

// ---------------------------------------------------------------- hardware APM (InfiniBand)

/// The skip line of the InfiniBand hardware-APM tests: what this machine lacks.
fn skip_ib(test: &str, why: &str) {
    println!("SKIPPED {test}: {why}");
}

/// An active InfiniBand port with a LID.
#[derive(Debug, Clone)]
struct IbPort {
    dev: String,
    port: u8,
    lid: u16,
    lmc: u8,
    sm_lid: u16,
    /// GID 0's subnet prefix: ports that share it (and an SM) are on one subnet.
    prefix: [u8; 8],
    mtu: Mtu,
    apm: bool,
}

/// Every active InfiniBand port of this machine (link layer InfiniBand, a LID assigned).
fn ib_ports(v: &Verbs) -> Vec<IbPort> {
    let mut out = Vec::new();
    for d in v.devices().unwrap_or_default() {
        let Ok(ctx) = v.open(&d.name) else { continue };
        let Ok(dev) = ctx.query_device() else {
            continue;
        };
        for port in 1..=dev.phys_port_cnt {
            let Ok(p) = ctx.query_port(port) else {
                continue;
            };
            if p.link_layer != LinkLayer::InfiniBand || p.state != PortState::Active || p.lid == 0 {
                continue;
            }
            let gid0 = ctx.query_gid(port, 0).ok().flatten();
            let mut prefix = [0u8; 8];
            if let Some(g) = gid0 {
                prefix.copy_from_slice(&g.gid[..8]);
            }
            out.push(IbPort {
                dev: d.name.clone(),
                port,
                lid: p.lid,
                lmc: p.lmc,
                sm_lid: p.sm_lid,
                prefix,
                mtu: p.active_mtu,
                apm: dev.auto_path_mig(),
            });
        }
    }
    out
}

/// One QP's two paths: the primary leaves `port` for the peer's `dlid`; the alternate
/// leaves `alt_port` (with `alt_bits` as source path bits) for `alt_dlid`.
#[derive(Debug, Clone, Copy)]
struct IbSide {
    port: u8,
    dlid: u16,
    alt_port: u8,
    alt_bits: u8,
    alt_dlid: u16,
}

/// Two ports that can reach each other, and primary/alternate paths between them.
#[derive(Debug)]
struct IbPlan {
    a_dev: String,
    b_dev: String,
    a: IbSide,
    b: IbSide,
    mtu: Mtu,
    /// How the alternate path differs from the primary.
    how: String,
    /// The alternate path uses other ports (not only other LIDs of the same ports).
    two_ports: bool,
}

/// Pick two InfiniBand ports on one subnet with a distinct alternate path, or say why
/// there are none (the skip reason).
fn ib_plan(v: &Verbs) -> Result<IbPlan, String> {
    let ports = ib_ports(v);
    if ports.len() < 2 {
        let names: Vec<String> = v
            .devices()
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.name)
            .collect();
        return Err(format!(
            "no two active InfiniBand ports (link layer InfiniBand) on this machine \
             (devices: {names:?}, active IB ports: {})",
            ports.len()
        ));
    }
    let same_subnet = |x: &IbPort, y: &IbPort| x.prefix == y.prefix && x.sm_lid == y.sm_lid;
    let mtu_of = |ps: &[&IbPort]| {
        if ps.iter().any(|p| p.mtu == Mtu::Mtu256) {
            Mtu::Mtu256
        } else {
            Mtu::Mtu1024
        }
    };
    let mut reasons = Vec::new();
    // 1. Two ports of one HCA: each QP's alternate leaves through the other's port.
    for (i, x) in ports.iter().enumerate() {
        for y in &ports[i + 1..] {
            if x.dev != y.dev || !same_subnet(x, y) {
                continue;
            }
            if !x.apm {
                reasons.push(format!("{} lacks IBV_DEVICE_AUTO_PATH_MIG", x.dev));
                continue;
            }
            return Ok(IbPlan {
                a_dev: x.dev.clone(),
                b_dev: y.dev.clone(),
                a: IbSide {
                    port: x.port,
                    dlid: y.lid,
                    alt_port: y.port,
                    alt_bits: 0,
                    alt_dlid: x.lid,
                },
                b: IbSide {
                    port: y.port,
                    dlid: x.lid,
                    alt_port: x.port,
                    alt_bits: 0,
                    alt_dlid: y.lid,
                },
                mtu: mtu_of(&[x, y]),
                how: format!(
                    "{} port {} <-> port {}: primary {}:{} -> LID {}, alternate {}:{} -> LID {}",
                    x.dev, x.port, y.port, x.dev, x.port, y.lid, x.dev, y.port, x.lid
                ),
                two_ports: true,
            });
        }
    }
    // 2. Two HCAs with two ports each on the subnet: primary over the first ports,
    //    alternate over the second ones.
    let on = |dev: &str| -> Vec<&IbPort> { ports.iter().filter(|p| p.dev == dev).collect() };
    for (i, x) in ports.iter().enumerate() {
        for y in &ports[i + 1..] {
            if x.dev == y.dev || !same_subnet(x, y) || !x.apm || !y.apm {
                continue;
            }
            let (xs, ys) = (on(&x.dev), on(&y.dev));
            let x2 = xs.iter().find(|p| p.port != x.port && same_subnet(p, x));
            let y2 = ys.iter().find(|p| p.port != y.port && same_subnet(p, y));
            let (Some(x2), Some(y2)) = (x2, y2) else {
                continue;
            };
            return Ok(IbPlan {
                a_dev: x.dev.clone(),
                b_dev: y.dev.clone(),
                a: IbSide {
                    port: x.port,
                    dlid: y.lid,
                    alt_port: x2.port,
                    alt_bits: 0,
                    alt_dlid: y2.lid,
                },
                b: IbSide {
                    port: y.port,
                    dlid: x.lid,
                    alt_port: y2.port,
                    alt_bits: 0,
                    alt_dlid: x2.lid,
                },
                mtu: mtu_of(&[x, y, x2, y2]),
                how: format!(
                    "{}:{} <-> {}:{} primary, {}:{} <-> {}:{} alternate",
                    x.dev, x.port, y.dev, y.port, x2.dev, x2.port, y2.dev, y2.port
                ),
                two_ports: true,
            });
        }
    }
    // 3. LMC > 0: the same ports, the alternate through each port's second LID.
    for (i, x) in ports.iter().enumerate() {
        for y in &ports[i + 1..] {
            if !same_subnet(x, y) {
                continue;
            }
            if !x.apm || !y.apm {
                reasons.push(format!(
                    "{} or {} lacks IBV_DEVICE_AUTO_PATH_MIG",
                    x.dev, y.dev
                ));
                continue;
            }
            if x.lmc == 0 && y.lmc == 0 {
                reasons.push(format!(
                    "{}:{} and {}:{} have LMC 0 and no second port for an alternate path",
                    x.dev, x.port, y.dev, y.port
                ));
                continue;
            }
            let (xb, yb) = (u8::from(x.lmc > 0), u8::from(y.lmc > 0));
            return Ok(IbPlan {
                a_dev: x.dev.clone(),
                b_dev: y.dev.clone(),
                a: IbSide {
                    port: x.port,
                    dlid: y.lid,
                    alt_port: x.port,
                    alt_bits: xb,
                    alt_dlid: y.lid + u16::from(yb),
                },
                b: IbSide {
                    port: y.port,
                    dlid: x.lid,
                    alt_port: y.port,
                    alt_bits: yb,
                    alt_dlid: x.lid + u16::from(xb),
                },
                mtu: mtu_of(&[x, y]),
                how: format!(
                    "{}:{} (LID {} LMC {}) <-> {}:{} (LID {} LMC {}): alternate LIDs {} <-> {}",
                    x.dev,
                    x.port,
                    x.lid,
                    x.lmc,
                    y.dev,
                    y.port,
                    y.lid,
                    y.lmc,
                    x.lid + u16::from(xb),
                    y.lid + u16::from(yb)
                ),
                two_ports: false,
            });
        }
    }
    if reasons.is_empty() {
        reasons.push("no two active InfiniBand ports share a subnet (prefix and SM LID)".into());
    }
    Err(format!(
        "no two InfiniBand ports with a distinct alternate path: {}",
        reasons.join("; ")
    ))
}

/// The address vector of a path through `port` (source path bits `bits`) to `dlid`.
fn ib_av(port: u8, bits: u8, dlid: u16) -> AddressVector {
    AddressVector {
        dlid,
        port_num: port,
        src_path_bits: bits,
        ..AddressVector::default()
    }
}

const IB_ACK_TIMEOUT: u8 = 14;

/// Connect `a` and `b` (RESET -> INIT -> RTR -> RTS) as `plan` says: the primary path
/// with the AV and, when `load_alt`, the alternate path with `IBV_QP_ALT_PATH` in
/// INIT->RTR. Migration state stays MIGRATED (no `IBV_QP_PATH_MIG_STATE`).
fn ib_connect(a: &End, b: &End, plan: &IbPlan, load_alt: bool) {
    for (me, peer, side, my_psn, peer_psn) in
        [(a, b, &plan.a, PSN_A, PSN_B), (b, a, &plan.b, PSN_B, PSN_A)]
    {
        qp_to_init(me, side.port);
        let mut rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: plan.mtu,
            dest_qp_num: peer.qp.qp_num(),
            rq_psn: peer_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ib_av(side.port, 0, side.dlid),
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
            rtr.alt_ah_attr = ib_av(side.alt_port, side.alt_bits, side.alt_dlid);
            rtr.alt_port_num = side.alt_port;
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
fn ib_ends(v: &Verbs, plan: &IbPlan) -> (End, End) {
    let open = |n: &str| v.open(n).unwrap_or_else(|e| panic!("open {n}: {e}"));
    (
        End::on_port(open(&plan.a_dev), plan.a.port),
        End::on_port(open(&plan.b_dev), plan.b.port),
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
fn ib_wait_armed(a: &mut End, b: &mut End) -> Duration {
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

/// Hardware APM on InfiniBand, through provider-verbs' `hw_apm`: arm, forced migration
/// under traffic, `IBV_EVENT_PATH_MIG` on both sides, rearm, and the same back again.
///
/// **Hardware needed**: two active InfiniBand ports (link layer InfiniBand, LIDs assigned
/// by a running subnet manager) on one subnet, on HCAs that advertise
/// `IBV_DEVICE_AUTO_PATH_MIG` (e.g. ConnectX), with a distinct alternate path: either two
/// ports of one HCA cabled to a switch (each QP's alternate leaves through the other
/// port), two HCAs with two ports each, or LMC > 0 (`opensm -l 1`; the alternate uses
/// each port's second LID). Run it with `cargo xtask hwtest` on that machine (the suite
/// runs `--ignored --test-threads=1`). Elsewhere — no RDMA, or only RoCE ports such as
/// the rxe pair of `cargo xtask hwtest --vm` — it prints one `SKIPPED ib_hardware_apm:`
/// line saying what is missing, and passes.
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
    let plan = match ib_plan(&v) {
        Ok(p) => p,
        Err(why) => return skip_ib(TEST, &why),
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
            "{} qpn {}: {:?} {:?}, primary port {port} dlid {}, alternate port {} dlid {} \
             path bits {}",
            e.ctx.name(),
            e.qp.qp_num(),
            q.qp_state,
            q.path_mig_state,
            q.ah_attr.dlid,
            q.alt_port_num,
            q.alt_ah_attr.dlid,
            q.alt_ah_attr.src_path_bits
        );
        assert_eq!(q.path_mig_state, provider_verbs::ffi::MigState::Migrated);
        assert_eq!((port, q.ah_attr.dlid), (side.port, side.dlid), "primary");
        assert_eq!(
            (q.alt_port_num, q.alt_ah_attr.dlid),
            (side.alt_port, side.alt_dlid),
            "alternate loaded at RTR"
        );
    }
    // Which side forces, and the paths each side has now (primary, alternate).
    let mut paths = [
        (
            ib_av(plan.a.port, 0, plan.a.dlid),
            ib_av(plan.a.alt_port, plan.a.alt_bits, plan.a.alt_dlid),
        ),
        (
            ib_av(plan.b.port, 0, plan.b.dlid),
            ib_av(plan.b.alt_port, plan.b.alt_bits, plan.b.alt_dlid),
        ),
    ];
    for (round, forcer) in [(1, 0usize), (2, 1)] {
        if round > 1 {
            // Rearm: the new alternate is the old primary, loaded on both sides before
            // either asks for REARM.
            for (k, e) in [&a, &b].into_iter().enumerate() {
                let alt = hw_apm::AltPath {
                    av: paths[k].1,
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
                "round {round}: {} qpn {}: {:?} {:?}, primary port {port} dlid {} path bits {} \
                 (was port {} dlid {})",
                e.ctx.name(),
                e.qp.qp_num(),
                q.qp_state,
                q.path_mig_state,
                q.ah_attr.dlid,
                q.ah_attr.src_path_bits,
                old_primary.port_num,
                old_primary.dlid
            );
            assert_eq!(q.qp_state, QpState::Rts, "{}: still RTS", e.ctx.name());
            assert_eq!(
                q.path_mig_state,
                provider_verbs::ffi::MigState::Migrated,
                "{}: MIGRATED after the migration",
                e.ctx.name()
            );
            assert_eq!(
                (port, q.ah_attr.dlid),
                (old_alt.port_num, old_alt.dlid),
                "{}: the primary (port, DLID) is the old alternate",
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
            av: paths[k].1,
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

/// The IBA MTU code of a path MTU (1 = 256 ... 5 = 4096).
fn mtu_code(m: Mtu) -> u8 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
        _ => 3,
    }
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
/// with `cargo xtask hwtest`; without such ports (and under `--vm`, whose rxe ports are
/// RoCE) it prints one `SKIPPED ib_hardware_apm_facet:` line and passes.
///
/// Not covered: the engine's own decision to force a migration, which it takes on a local
/// `PORT_ERR` (or an SA trap 65): a real port cannot be failed from here, so the test
/// issues `force_migrate` itself, as the engine would. The engine's rearm after a
/// migration also needs its peer channel (LAP/APR) and is exercised by `apm pingpong` on
/// InfiniBand, not here.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn ib_hardware_apm_through_the_verbs_facet() {
    use apm_core::{ConnId, Input, Lid, MigState, Path, PortKey, QpControl, QpEvent};
    const TEST: &str = "ib_hardware_apm_facet";
    let v = verbs();
    let plan = match ib_plan(&v) {
        Ok(p) => p,
        Err(why) => return skip_ib(TEST, &why),
    };
    if !plan.two_ports {
        return skip_ib(
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
    let lid_of = |e: &End, port: u8, bits: u8| {
        e.ctx.query_port(port).expect("query_port").lid + u16::from(bits)
    };
    let path = |dev: u16, port: u8, slid: u16, dlid: u16| Path {
        port: PortKey::new(dev, port),
        slid: Lid::from_wire(slid),
        dlid: Lid::from_wire(dlid),
        sgid: apm_core::Gid::default(),
        dgid: apm_core::Gid::default(),
        sgid_index: 0,
        sl: 0,
        flow_label: 0,
        traffic_class: 0,
        hop_limit: 0,
        rate: 0,
        mtu: mtu_code(plan.mtu),
        pkey_index: 0,
        ack_timeout: IB_ACK_TIMEOUT,
    };
    // (primary, alternate) of each connection.
    let mut paths = [
        (
            path(dev_a, plan.a.port, lid_of(&a, plan.a.port, 0), plan.a.dlid),
            path(
                dev_a,
                plan.a.alt_port,
                lid_of(&a, plan.a.alt_port, plan.a.alt_bits),
                plan.a.alt_dlid,
            ),
        ),
        (
            path(dev_b, plan.b.port, lid_of(&b, plan.b.port, 0), plan.b.dlid),
            path(
                dev_b,
                plan.b.alt_port,
                lid_of(&b, plan.b.alt_port, plan.b.alt_bits),
                plan.b.alt_dlid,
            ),
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
                (snap.primary_port, snap.primary_dlid),
                (old_alt.port, old_alt.dlid),
                "{:?}: the primary is the old alternate",
                conns[k]
            );
            paths[k] = (old_alt, old_primary);
        }
        exchange(&mut a, &mut b, 200);
    }
    println!("{TEST}: two forced migrations and rearms through the facet; passed");
}
