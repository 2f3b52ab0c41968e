//! The hardware suite: real RDMA devices through the libibverbs binding.
//!
//! Every test is `#[ignore]`d: a plain `cargo test` never touches devices. Run it with
//! `cargo xtask hwtest` (this machine's devices; skipped with a message when there are
//! none) or `cargo xtask hwtest --vm` (two soft-RoCE devices, rxe0 on veth `vA` and rxe1
//! on its peer `vB`, in a throw-away qemu VM). Tests that take a link down run only when
//! `APM_HWTEST_LINK_TOGGLE=1` (set by `--vm`): on a real machine that could cut users off.

// Real devices in real time: the suite times events and traffic with the wall clock.
#![allow(clippy::disallowed_methods)]

use provider_verbs::ffi::{
    sys, AddressVector, AsyncEventKind, Context, Cq, EventElement, GidType, LinkLayer, Mr, Mtu, Pd,
    PortState, Qp, QpAttr, QpAttrMask, QpCaps, QpState, Verbs,
};
use provider_verbs::{hw_apm, VerbsError};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn verbs() -> Verbs {
    Verbs::load().unwrap_or_else(|e| panic!("{e}"))
}

fn device_names(v: &Verbs) -> Vec<String> {
    let devs = v
        .devices()
        .unwrap_or_else(|e| panic!("listing devices: {e}"));
    assert!(
        !devs.is_empty(),
        "no RDMA devices: the hardware suite needs at least one (try `cargo xtask hwtest --vm`)"
    );
    devs.into_iter().map(|d| d.name).collect()
}

fn link_toggle_allowed() -> bool {
    std::env::var("APM_HWTEST_LINK_TOGGLE").as_deref() == Ok("1")
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn devices_and_gid_tables() {
    let v = verbs();
    for name in device_names(&v) {
        let ctx = v.open(&name).unwrap_or_else(|e| panic!("open {name}: {e}"));
        let dev = ctx.query_device().expect("query_device");
        println!(
            "{name}: fw {:?} guid {:016x} ports {} AUTO_PATH_MIG {} max_qp {}",
            dev.fw_ver,
            dev.node_guid,
            dev.phys_port_cnt,
            dev.auto_path_mig(),
            dev.max_qp
        );
        assert!(dev.phys_port_cnt >= 1, "{name} has no ports");
        for port in 1..=dev.phys_port_cnt {
            let p = ctx.query_port(port).expect("query_port");
            println!(
                "  port {port}: {:?} phys {} {:?} lid {} lmc {} mtu {:?} gid_tbl_len {}",
                p.state, p.phys_state, p.link_layer, p.lid, p.lmc, p.active_mtu, p.gid_tbl_len
            );
            assert!(
                p.gid_tbl_len > 0,
                "{name} port {port}: empty GID table size"
            );
            let t = std::time::Instant::now();
            let gids = ctx.gid_table(port).expect("gid table");
            let one_call = t.elapsed();
            // The table in one call (what the rail watcher reads twice a second) is what
            // the slots read one by one say.
            let t = std::time::Instant::now();
            let slots: Vec<_> = (0..u32::try_from(p.gid_tbl_len).unwrap_or(0))
                .filter_map(|i| ctx.query_gid(port, i).expect("query_gid"))
                .collect();
            println!(
                "  port {port}: {} GIDs, one table query {one_call:?}, slot by slot {:?}",
                gids.len(),
                t.elapsed()
            );
            assert_eq!(
                gids, slots,
                "{name} port {port}: the table query and the slots differ"
            );
            for g in &gids {
                println!(
                    "    gid[{}] {} {:?} ifindex {}",
                    g.index,
                    g.as_ipv6(),
                    g.gid_type,
                    g.ndev_ifindex
                );
            }
            if p.state == PortState::Active {
                assert!(!gids.is_empty(), "{name} port {port} is active with no GID");
            }
            if p.link_layer == LinkLayer::Ethernet {
                assert!(
                    gids.iter()
                        .all(|g| matches!(g.gid_type, GidType::RoceV1 | GidType::RoceV2)),
                    "a RoCE port lists a non-RoCE GID"
                );
            }
        }
    }
}

/// The netdev behind a RoCE port (sysfs; the GID attributes name it).
fn netdev_of(dev: &str, port: u8) -> Option<String> {
    let dir = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/ndevs");
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    entries
        .iter()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .map(|s| s.trim().to_owned())
        .find(|s| !s.is_empty())
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("/usr/bin/ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("ip {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn port_err_and_active_on_link_down_up() {
    if !link_toggle_allowed() {
        println!("SKIPPED: takes a link down; set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)");
        return;
    }
    let v = verbs();
    let Some((name, netdev)) = device_names(&v)
        .into_iter()
        .find_map(|n| netdev_of(&n, 1).map(|d| (n, d)))
    else {
        println!("SKIPPED: no RoCE device with a netdev to take down");
        return;
    };
    let ctx = v.open(&name).expect("open");
    let rt = runtime();
    rt.block_on(async {
        let mut events = ctx.async_events().expect("async events");
        // Drain what is already queued (e.g. GID changes of the set-up).
        while let Ok(Some(ev)) = events.try_next() {
            println!("(earlier) {ev:?}");
        }
        ip(&["link", "set", &netdev, "down"]);
        let (t_down, others) = wait_for(&mut events, AsyncEventKind::PortErr)
            .await
            .expect("PORT_ERR within 10 s of link down");
        println!("{name}: link {netdev} down -> PORT_ERR after {t_down:?} (also seen: {others:?})");
        assert_eq!(
            ctx.query_port(1).expect("query_port").state,
            PortState::Down
        );

        ip(&["link", "set", &netdev, "up"]);
        let (t_up, others) = wait_for(&mut events, AsyncEventKind::PortActive)
            .await
            .expect("PORT_ACTIVE within 10 s of link up");
        println!("{name}: link {netdev} up -> PORT_ACTIVE after {t_up:?} (also seen: {others:?})");
        // rxe delivers PORT_ACTIVE twice, ~1 ms apart: count tolerantly, but never a
        // PORT_ERR after the link came back.
        let mut extra = Vec::new();
        let until = Instant::now() + Duration::from_millis(300);
        while let Ok(Ok(ev)) = tokio::time::timeout(
            until.saturating_duration_since(Instant::now()),
            events.next(),
        )
        .await
        {
            extra.push(ev);
        }
        let dup = extra
            .iter()
            .filter(|e| e.kind == AsyncEventKind::PortActive)
            .count();
        println!("{name}: {dup} duplicate PORT_ACTIVE; other events after up: {extra:?}");
        assert!(
            !extra.iter().any(|e| e.kind == AsyncEventKind::PortErr),
            "PORT_ERR after the link came back"
        );
        assert_eq!(
            ctx.query_port(1).expect("query_port").state,
            PortState::Active
        );
    });
    // The IPv6 link-local address (and so the GID) comes back with the link: wait for it
    // so later tests find it.
    wait_for_gid(&ctx, 1);
}

/// The next `kind` event (on port 1) within 10 s, with how long it took and what else
/// arrived first.
async fn wait_for(
    events: &mut provider_verbs::ffi::AsyncEvents,
    kind: AsyncEventKind,
) -> Result<(Duration, Vec<provider_verbs::ffi::AsyncEvent>), tokio::time::error::Elapsed> {
    let start = Instant::now();
    let mut others = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let ev = events.next().await.expect("async event");
            if ev.kind == kind {
                assert_eq!(ev.element, EventElement::Port(1), "event for port 1");
                return;
            }
            others.push(ev);
        }
    })
    .await?;
    Ok((start.elapsed(), others))
}

/// Wait until the port is active with a usable GID (after set-up or a link toggle).
fn wait_for_gid(ctx: &Context, port: u8) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let active = ctx.query_port(port).map(|p| p.state == PortState::Active);
        if active.unwrap_or(false) && pick_gid(ctx, port).is_some() {
            return;
        }
        assert!(
            Instant::now() < until,
            "{} port {port}: no active port with a GID after 10 s",
            ctx.name()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The GID to address a peer with: on RoCE a RoCE v2 IPv6 link-local GID (two rxe
/// devices in one namespace talk only over those: IPv4 routes go via lo), else the first
/// RoCE v2 one; on InfiniBand none (LID routing).
fn pick_gid(ctx: &Context, port: u8) -> Option<(u8, [u8; 16])> {
    let gids = ctx.gid_table(port).ok()?;
    let v2 = |g: &&provider_verbs::ffi::GidEntry| g.gid_type == GidType::RoceV2;
    let g = gids
        .iter()
        .filter(v2)
        .find(|g| g.gid[0] == 0xfe && g.gid[1] & 0xc0 == 0x80)
        .or_else(|| gids.iter().find(v2))?;
    Some((u8::try_from(g.index).ok()?, g.gid))
}

/// One side of an RC connection.
struct End {
    ctx: Context,
    _pd: Pd,
    cq: Cq,
    mr: Mr,
    qp: Arc<Qp>,
    port: u8,
    lid: u16,
    gid: Option<(u8, [u8; 16])>,
    mtu: Mtu,
}

const SLOT: usize = 64;
const DEPTH: u32 = 128;

impl End {
    fn new(v: &Verbs, name: &str) -> End {
        End::on(v.open(name).unwrap_or_else(|e| panic!("open {name}: {e}")))
    }

    fn on(ctx: Context) -> End {
        End::on_port(ctx, 1)
    }

    fn on_port(ctx: Context, port: u8) -> End {
        let p = ctx.query_port(port).expect("query_port");
        let gid = if p.link_layer == LinkLayer::Ethernet {
            wait_for_gid(&ctx, port);
            pick_gid(&ctx, port)
        } else {
            None
        };
        let pd = ctx.alloc_pd().expect("alloc_pd");
        let cq = ctx.create_cq(2 * DEPTH as i32).expect("create_cq");
        // Receive slots first, then send slots.
        let mr = pd.reg_mr(2 * DEPTH as usize * SLOT).expect("reg_mr");
        let qp = pd
            .create_rc_qp(
                &cq,
                &cq,
                QpCaps {
                    max_send_wr: DEPTH,
                    max_recv_wr: DEPTH,
                },
            )
            .expect("create_qp");
        let qp = Arc::new(qp);
        End {
            ctx,
            _pd: pd,
            cq,
            mr,
            qp,
            port,
            lid: p.lid,
            gid,
            mtu: p.active_mtu,
        }
    }

    /// The address vector that reaches this end.
    fn av_to(&self, from: &End) -> AddressVector {
        AddressVector {
            dlid: self.lid,
            port_num: from.port,
            is_global: self.gid.is_some(),
            dgid: self.gid.map(|g| g.1).unwrap_or_default(),
            sgid_index: from.gid.map(|g| g.0).unwrap_or(0),
            hop_limit: 64,
            ..AddressVector::default()
        }
    }
}

const PSN_A: u32 = 0x1000;
const PSN_B: u32 = 0x2000;

/// RESET -> INIT on `port`, with remote read and write allowed.
fn qp_to_init(me: &End, port: u8) {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: port,
        qp_access_flags: sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ,
        ..QpAttr::default()
    };
    me.qp
        .modify(
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .expect("RESET->INIT");
}

/// RTR -> RTS with send PSN `psn` and local ACK timeout `timeout` (retries unlimited).
fn qp_to_rts(me: &End, psn: u32, timeout: u8) {
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: psn,
        timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    me.qp
        .modify(
            &rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
        .expect("RTR->RTS");
}

/// Move both QPs RESET -> INIT -> RTR -> RTS, each pointing at the other.
fn connect(a: &End, b: &End) {
    for (me, peer, my_psn, peer_psn) in [(a, b, PSN_A, PSN_B), (b, a, PSN_B, PSN_A)] {
        qp_to_init(me, me.port);
        let mtu = if me.mtu == Mtu::Mtu256 || peer.mtu == Mtu::Mtu256 {
            Mtu::Mtu256
        } else {
            Mtu::Mtu1024
        };
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: mtu,
            dest_qp_num: peer.qp.qp_num(),
            rq_psn: peer_psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: peer.av_to(me),
            ..QpAttr::default()
        };
        me.qp
            .modify(
                &rtr,
                QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER,
            )
            .expect("INIT->RTR");
        qp_to_rts(me, my_psn, 14);
    }
    for e in [a, b] {
        let q = e.qp.query(QpAttrMask::STATE).expect("query_qp");
        assert_eq!(q.qp_state, QpState::Rts, "{} QP not in RTS", e.ctx.name());
    }
}

/// Two ends on two devices when there are two, else both on the first one.
fn pair(v: &Verbs) -> (End, End) {
    let names = device_names(v);
    let a = End::new(v, &names[0]);
    let b = End::new(v, names.get(1).unwrap_or(&names[0]));
    connect(&a, &b);
    (a, b)
}

/// Send `n` numbered messages each way and check every one arrives once, in order.
fn exchange(a: &mut End, b: &mut End, n: u64) {
    exchange_with(a, b, n, n, |_, _| {});
}

/// [`exchange`], calling `during` once, when `a` has posted `at` of its messages (with
/// sends still in flight both ways), e.g. to migrate the connection under traffic.
fn exchange_with(a: &mut End, b: &mut End, n: u64, at: u64, mut during: impl FnMut(&End, &End)) {
    let mut pending = Some(&mut during);
    let recv_slot = |i: u64| (i % u64::from(DEPTH)) as usize * SLOT;
    let send_off = DEPTH as usize * SLOT;
    for e in [&*a, &*b] {
        for i in 0..u64::from(DEPTH).min(n) {
            e.qp.post_recv(i, &e.mr, recv_slot(i), SLOT)
                .expect("post_recv");
        }
    }
    // Per end: next seq to send, sends outstanding, next seq expected, receives posted.
    let mut st = [(0u64, 0u64, 0u64, u64::from(DEPTH).min(n)); 2];
    let deadline = Instant::now() + Duration::from_secs(30);
    while st.iter().any(|s| s.0 < n || s.1 > 0 || s.2 < n) {
        if st[0].0 >= at {
            if let Some(f) = pending.take() {
                f(a, b);
            }
        }
        assert!(
            Instant::now() < deadline,
            "traffic stalled: (sent, outstanding, received) a={:?} b={:?}",
            st[0],
            st[1]
        );
        for (k, e) in [&mut *a, &mut *b].into_iter().enumerate() {
            let s = &mut st[k];
            // Keep a window of sends outstanding; each message is its 8-byte number.
            while s.0 < n && s.1 < u64::from(DEPTH) / 2 {
                let slot = send_off + (s.0 % u64::from(DEPTH)) as usize * SLOT;
                e.mr.as_mut_slice()[slot..slot + 8].copy_from_slice(&s.0.to_be_bytes());
                e.qp.post_send(1 << 32 | s.0, &e.mr, slot, 8, None)
                    .expect("post_send");
                s.0 += 1;
                s.1 += 1;
            }
            for wc in e.cq.poll(64).expect("poll_cq") {
                assert!(
                    wc.status.is_success(),
                    "{}: completion {wc:?} failed: {}",
                    e.ctx.name(),
                    wc.status.text
                );
                if wc.wr_id >> 32 == 1 {
                    s.1 -= 1;
                    continue;
                }
                let slot = recv_slot(wc.wr_id);
                let mut num = [0u8; 8];
                num.copy_from_slice(&e.mr.as_slice()[slot..slot + 8]);
                let got = u64::from_be_bytes(num);
                assert_eq!(wc.byte_len, 8, "message length");
                assert_eq!(
                    got,
                    s.2,
                    "{}: message {got} arrived when {} was due (lost or duplicated)",
                    e.ctx.name(),
                    s.2
                );
                s.2 += 1;
                if s.3 < n {
                    e.qp.post_recv(s.3, &e.mr, recv_slot(s.3), SLOT)
                        .expect("post_recv");
                    s.3 += 1;
                }
            }
        }
    }
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn rc_pair_carries_numbered_messages_both_ways() {
    let v = verbs();
    let (mut a, mut b) = pair(&v);
    let start = Instant::now();
    let n = 1000;
    exchange(&mut a, &mut b, n);
    println!(
        "{} qpn {} <-> {} qpn {}: {n} messages each way, in order, none lost or \
         duplicated, in {:?}",
        a.ctx.name(),
        a.qp.qp_num(),
        b.ctx.name(),
        b.qp.qp_num(),
        start.elapsed()
    );
}

/// provider-rxe's migration of a QP the application owns (`AdoptedQp`), on a real
/// device: in the middle of 1000 messages each way, A's QP is drained and its address
/// vector set again (RTS -> SQD, `sq_draining` polled, AV, SQD -> RTS, an unsignalled
/// kick): every message still arrives once and in order, and the kick leaves nothing in
/// the application's CQ (the exchange fails on any completion it did not post). Then A's
/// QP is put in ERR: a migration is refused with the reason, and apm does not touch it.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
#[allow(unsafe_code)] // Qp::adopt of the test's own QP, as an application would hand it over
fn adopted_qp_moves_through_the_sq_drain_and_a_failed_one_is_refused() {
    let v = verbs();
    if netdev_of(&device_names(&v)[0], 1).is_none() {
        println!("SKIPPED: software migration is for RoCE devices (rxe)");
        return;
    }
    let (mut a, mut b) = pair(&v);
    // SAFETY: the QP is live for the whole test (`a` outlives the adopted handle).
    let adopted = unsafe { Qp::adopt(&a.ctx, a.qp.as_raw()) }.expect("adopt");
    assert!(adopted.is_adopted());
    let adopted = provider_rxe::AdoptedQp::new(Arc::new(adopted)).expect("an RTS QP");
    let rt = runtime();
    let av = b.av_to(&a);
    let mut took = None;
    exchange_with(&mut a, &mut b, 1000, 400, |_, _| {
        let t0 = Instant::now();
        rt.block_on(adopted.migrate(av, Duration::from_secs(2)))
            .expect("migration under traffic");
        took = Some(t0.elapsed());
    });
    assert_eq!(adopted.migrations(), 1);
    println!(
        "adopted QP {}: SQ-drain move under traffic in {:?}; 1000 messages each way, in order",
        a.qp.qp_num(),
        took.expect("the hook ran")
    );
    let err = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    a.qp.modify(&err, QpAttrMask::STATE).expect("RTS->ERR");
    let refused = rt
        .block_on(adopted.migrate(av, Duration::from_secs(2)))
        .expect_err("a QP in ERR cannot be moved without its work");
    assert!(refused.to_string().contains("error state"), "{refused}");
    assert_eq!(
        a.qp.query(QpAttrMask::STATE).expect("query").qp_state,
        QpState::Err,
        "apm left the failed QP alone"
    );
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn hardware_apm_on_roce_is_refused_up_front() {
    let v = verbs();
    let (mut a, mut b) = pair(&v);
    if a.gid.is_none() {
        println!(
            "SKIPPED: {} port {} is InfiniBand, where hardware APM is not refused: the \
             ib_hardware_apm_* tests run it (arm, forced migration, PATH_MIG, rearm)",
            a.ctx.name(),
            a.port
        );
        return;
    }
    if hw_apm::available(&a.ctx, a.port).is_ok() {
        println!(
            "SKIPPED: the kernel accepts alternate paths on {} (the patched soft-RoCE): the \
             ib_hardware_apm_* and roce_hw_apm_* tests run hardware APM there",
            a.ctx.name()
        );
        return;
    }
    let alt = hw_apm::AltPath {
        av: b.av_to(&a),
        pkey_index: 0,
        timeout: 14,
    };
    let cases: [(&str, Result<(), VerbsError>); 3] = [
        ("load alternate", hw_apm::load_alternate(&a.qp, &alt)),
        ("set REARM", hw_apm::set_rearm(&a.qp)),
        ("force MIGRATED", hw_apm::force_migrated(&a.qp)),
    ];
    for (what, r) in cases {
        match r {
            Err(e @ VerbsError::HardwareApmOnRoce { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("provider-rxe"), "{what}: {msg}");
                println!("{what}: refused: {msg}");
            }
            other => panic!("{what}: expected a RoCE refusal, got {other:?}"),
        }
    }
    // What the refusal spares the user: the kernel rejects IBV_QP_ALT_PATH on RoCE.
    let raw = QpAttr {
        alt_ah_attr: alt.av,
        alt_port_num: alt.av.port_num,
        alt_timeout: 14,
        ..QpAttr::default()
    };
    let err =
        a.qp.modify(&raw, QpAttrMask::ALT_PATH)
            .expect_err("the kernel accepted an alternate path on RoCE");
    println!("raw RTS->RTS with IBV_QP_ALT_PATH: {err}");
    assert_eq!(err.errno(), Some(libc_einval()), "{err}");
    // Nothing was broken by the attempts: the connection still carries traffic.
    let (state, mig) = hw_apm::query(&a.qp).expect("query");
    println!("after the attempts: {state:?} {mig:?}");
    assert_eq!(state, QpState::Rts);
    exchange(&mut a, &mut b, 10);
}

/// EINVAL on Linux (all architectures apm targets).
fn libc_einval() -> i32 {
    22
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn facet_reports_ports_and_events_and_refuses_hw_apm_on_roce() {
    use apm_core::{ConnId, Input, MigState, PortEvent, PortKey, ProviderError, QpControl};
    let v = verbs();
    let names = device_names(&v);
    let ctxs: Vec<Context> = names
        .iter()
        .map(|n| v.open(n).unwrap_or_else(|e| panic!("open {n}: {e}")))
        .collect();
    let a = End::on(ctxs[0].clone());
    let b = End::on(ctxs.get(1).unwrap_or(&ctxs[0]).clone());
    connect(&a, &b);
    let facet = provider_verbs::VerbsQpControl::new(ctxs.clone());
    let conn = ConnId(7);
    facet.register(conn, a.qp.clone()).expect("register");
    let rt = runtime();
    rt.block_on(async {
        let (sink, mut inputs) = tokio::sync::mpsc::unbounded_channel();
        facet.start(sink).await.expect("start");
        let mut ports = Vec::new();
        while let Ok(Input::PortInfo(p)) = inputs.try_recv() {
            println!(
                "PortInfo {}: active {} {:?} lid {} gids {:?}",
                p.key,
                p.active,
                p.link_layer,
                p.lid,
                p.gids.iter().map(|g| g.to_string()).collect::<Vec<_>>()
            );
            ports.push(p);
        }
        assert!(
            ports.len() >= ctxs.len(),
            "one PortInfo per port of every device"
        );
        assert!(ports.iter().all(|p| p.active && !p.gids.is_empty()));

        let snap = facet.query_qp(conn).await.expect("query_qp");
        println!("QueryQp: {snap:?}");
        assert!(snap.operational);
        assert_eq!(snap.mig_state, MigState::Migrated);
        assert_eq!(snap.primary_port, PortKey::new(0, 1));
        if let Some((_, gid)) = b.gid {
            assert_eq!(snap.primary_dgid.0, gid, "primary DGID read back");
        }
        assert_eq!(
            facet.query_qp(ConnId(99)).await,
            Err(ProviderError::UnknownConnection(ConnId(99)))
        );

        let refused = a.gid.is_some() && hw_apm::available(&a.ctx, a.port).is_err();
        if refused {
            let path = apm_core::Path {
                sgid_index: a.gid.map(|g| g.0).unwrap_or(0),
                ..apm_core::Path::roce(
                    PortKey::new(0, 1),
                    apm_core::Gid(a.gid.map(|g| g.1).unwrap_or_default()),
                    apm_core::Gid(b.gid.map(|g| g.1).unwrap_or_default()),
                    apm_core::Path::MTU_1024,
                    apm_core::Path::ACK_TIMEOUT_67MS,
                )
            };
            let results = [
                (
                    "load_alternate",
                    facet.load_alternate(conn, path).await.err(),
                ),
                ("set_rearm", facet.set_rearm(conn).await.err()),
                ("force_migrate", facet.force_migrate(conn).await.err()),
            ];
            for (what, r) in results {
                match r {
                    Some(e @ ProviderError::Unsupported { .. }) => {
                        let text = e.to_string();
                        assert!(text.contains("provider-rxe"), "{what}: {text}");
                        println!("{what}: Unsupported: {text}");
                    }
                    other => panic!("{what}: expected Unsupported on RoCE, got {other:?}"),
                }
            }
            assert!(matches!(
                facet
                    .software_migrate(conn, path, apm_core::PeerMove::Done)
                    .await,
                Err(ProviderError::Unsupported { .. })
            ));
        }

        if !link_toggle_allowed() {
            println!("link toggle SKIPPED: set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)");
            return;
        }
        let Some(netdev) = netdev_of(&names[0], 1) else {
            println!("link toggle SKIPPED: {} has no netdev", names[0]);
            return;
        };
        let want = PortKey::new(0, 1);
        for (updown, event) in [("down", PortEvent::Down), ("up", PortEvent::Active)] {
            ip(&["link", "set", &netdev, updown]);
            // Timed from the command's return: starting `ip` under TCG takes long.
            let start = Instant::now();
            let seen = tokio::time::timeout(Duration::from_secs(10), async {
                let mut others = Vec::new();
                while let Some(i) = inputs.recv().await {
                    match i {
                        Input::PortEvent { port, event: e } if port == want && e == event => {
                            return others;
                        }
                        other => others.push(other),
                    }
                }
                panic!("the facet closed its input stream");
            })
            .await
            .unwrap_or_else(|_| panic!("no PortEvent {event:?} for {want} within 10 s"));
            println!(
                "link {netdev} {updown} -> engine input PortEvent {event:?} on {want} after \
                 {:?} (before it: {} other inputs)",
                start.elapsed(),
                seen.len()
            );
        }
    });
    wait_for_gid(&ctxs[0], 1);
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn the_kernel_names_the_process_that_created_a_qp() {
    // What the agent asks before it takes a registration (apm-agent's `SystemHost`,
    // RDMA netlink's resource tracking): a QP of this process is this process's, a QP
    // number the device does not have is nobody's.
    use apm_agent::host::{Host, SystemHost};
    let v = verbs();
    let name = device_names(&v).remove(0);
    let ctx = v.open(&name).expect("open");
    let gid = ctx
        .first_gid(1, |g| g.gid_type == GidType::RoceV2)
        .expect("gid table")
        .expect("a RoCE v2 GID");
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(4).expect("cq");
    let qp = pd
        .create_rc_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_wr: 1,
                max_recv_wr: 1,
            },
        )
        .expect("qp");
    // A QP is a port's resource once it is in INIT (in RESET it has no port yet).
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..QpAttr::default()
        },
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .expect("INIT");
    let host = SystemHost::default();
    let g = apm_core::Gid(gid.gid);
    let record = host
        .qp(&g, qp.qp_num())
        .unwrap_or_else(|e| panic!("the kernel could not be asked: {e}"));
    let Some(record) = record else {
        // What iproute2's `rdma` says of the same QP, and the device index asked.
        let shown = std::process::Command::new("/usr/bin/rdma")
            .args(["resource", "show", "qp"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let index = apm_agent::rdma_nl::RdmaNetlink::open()
            .and_then(|mut nl| nl.device_index(&name))
            .map_err(|e| e.to_string());
        panic!(
            "the kernel knows no QP {} on {name} (index {index:?}) port 1, GID {g}; \
             rdma says:\n{shown}",
            qp.qp_num()
        );
    };
    assert_eq!(record.pid, Some(std::process::id()), "{record:?}");
    assert_eq!(host.qp(&g, 0x00ff_fff0).expect("asked"), None, "no such QP");
    println!(
        "{name}: QP {} belongs to process {:?} (RDMA netlink)",
        qp.qp_num(),
        record.pid
    );
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn each_port_says_what_can_move_a_qp_by_trying_it() {
    // The capability probe on a real kernel: stock rxe takes the SQ-drain move and
    // refuses alternates (the core bans them on RoCE); the patched rxe takes alternates
    // and arms them. Whatever the phase, the probe's verdict on hardware APM is the
    // kernel's own answer (`hw_apm::available`).
    use provider_verbs::capability::{probe_port, Mechanism};
    let v = verbs();
    for name in device_names(&v) {
        let ctx = v.open(&name).expect("open");
        let probe = probe_port(&ctx, 1);
        println!("{}", probe.line());
        assert!(
            probe.sqd_repath.yes(),
            "rxe takes RTS->SQD->RTS: {}",
            probe.line()
        );
        let hardware = hw_apm::available(&ctx, 1).is_ok();
        assert_eq!(probe.alternate_path.yes(), hardware, "{}", probe.line());
        let want = if hardware {
            Mechanism::HardwareApm
        } else {
            Mechanism::SoftwareMove
        };
        assert_eq!(probe.mechanism(), want, "{}", probe.line());
        // The QP still works for the program after the probe: nothing is left behind
        // on the device (the pair was destroyed).
        let again = probe_port(&ctx, 1);
        assert_eq!(again.mechanism(), want, "{}", again.line());
    }
}

#[path = "hw/apm_plan.rs"]
mod apm_plan;
// `apm run` with unmodified Debian programs (ibv_rc_pingpong, perftest, rping).
#[path = "hw/apm_run.rs"]
mod apm_run;
#[path = "hw/bench_failover.rs"]
mod bench_failover;
#[path = "hw/bonds.rs"]
mod bonds;
#[path = "hw/child.rs"]
mod child;
#[path = "hw/failover.rs"]
mod failover;
#[path = "hw/forged.rs"]
mod forged;
#[path = "hw/guest_pauses.rs"]
mod guest_pauses;
#[path = "hw/guest_perf.rs"]
mod guest_perf;
#[path = "hw/guest_sched.rs"]
mod guest_sched;
#[path = "hw/hardware_apm.rs"]
mod hardware_apm;
#[path = "hw/pingpong_cuts.rs"]
mod pingpong_cuts;
#[path = "hw/rails.rs"]
mod rails;
#[path = "hw/roce_apm.rs"]
mod roce_apm;
