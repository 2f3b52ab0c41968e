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
            let gids = ctx.gid_table(port).expect("gid table");
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
    let adopted =
        provider_rxe::AdoptedQp::new(Arc::new(adopted)).expect("an RTS QP with remote write");
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

        if a.gid.is_some() {
            let path = apm_core::Path {
                port: PortKey::new(0, 1),
                slid: apm_core::Lid::from_wire(0),
                dlid: apm_core::Lid::from_wire(0),
                sgid: apm_core::Gid(a.gid.map(|g| g.1).unwrap_or_default()),
                dgid: apm_core::Gid(b.gid.map(|g| g.1).unwrap_or_default()),
                sgid_index: a.gid.map(|g| g.0).unwrap_or(0),
                sl: 0,
                flow_label: 0,
                traffic_class: 0,
                hop_limit: 64,
                rate: 0,
                mtu: 3,
                pkey_index: 0,
                ack_timeout: 14,
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
                    Some(ProviderError::Unsupported { operation, .. }) => {
                        assert!(operation.contains("provider-rxe"), "{what}: {operation}");
                        println!("{what}: Unsupported: {operation}");
                    }
                    other => panic!("{what}: expected Unsupported on RoCE, got {other:?}"),
                }
            }
            assert!(matches!(
                facet.software_migrate(conn, path).await,
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

// ---------------------------------------------------------------- software failover

/// The two-rail layout of a protected RoCE connection in one network namespace: VLANs 10
/// and 20 on the veth pair `vA`<->`vB` (rxe0 on `vA`, rxe1 on `vB`); each VLAN's IPv4
/// addresses become RoCE v2 GIDs of the device on its parent. Two local addresses talk
/// over the wire only with `rp_filter` 0, `accept_local` 1, the `local` table rule moved
/// below per-source rules for locally generated packets (`iif lo`), and each source
/// address routed through its VLAN. Idempotent: earlier tests toggle `vA`, which also
/// removes the per-source routes.
const RAILS: [(u16, &str, &str); 2] = [
    (10, "10.0.10.1", "10.0.10.2"),
    (20, "10.0.20.1", "10.0.20.2"),
];

fn ip_quiet(args: &[&str]) -> bool {
    std::process::Command::new("/usr/bin/ip")
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn sysctl(path: &str, value: &str) {
    let p = format!("/proc/sys/net/ipv4/conf/{path}");
    std::fs::write(&p, value).unwrap_or_else(|e| panic!("write {p}: {e}"));
}

fn rail_routes(vlan: u16, a: &str, b: &str) {
    for (dev, src, dst, table) in [
        (format!("vA.{vlan}"), a, b, 100 + u32::from(vlan)),
        (format!("vB.{vlan}"), b, a, 200 + u32::from(vlan)),
    ] {
        let table = table.to_string();
        ip(&[
            "route", "replace", dst, "dev", &dev, "src", src, "table", &table,
        ]);
        if !rule_present(src, &table) {
            ip(&[
                "rule", "add", "pref", "100", "from", src, "iif", "lo", "lookup", &table,
            ]);
        }
    }
}

fn rule_present(src: &str, table: &str) -> bool {
    std::process::Command::new("/usr/bin/ip")
        .args(["rule", "show"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).lines().any(|l| {
                l.contains(&format!("from {src} ")) && l.contains(&format!("lookup {table}"))
            })
        })
        .unwrap_or(false)
}

fn setup_rails() {
    for (vlan, a, b) in RAILS {
        for (parent, addr) in [("vA", a), ("vB", b)] {
            let dev = format!("{parent}.{vlan}");
            if !ip_quiet(&["link", "show", &dev]) {
                ip(&[
                    "link",
                    "add",
                    "link",
                    parent,
                    "name",
                    &dev,
                    "type",
                    "vlan",
                    "id",
                    &vlan.to_string(),
                ]);
                ip(&["addr", "add", &format!("{addr}/24"), "dev", &dev]);
            }
            ip(&["link", "set", &dev, "up"]);
        }
    }
    for dev in [
        "all", "default", "vA", "vB", "vA.10", "vA.20", "vB.10", "vB.20", "lo",
    ] {
        sysctl(&format!("{dev}/rp_filter"), "0");
        sysctl(&format!("{dev}/accept_local"), "1");
    }
    if !rule_present_pref("1000", "local") {
        ip(&["rule", "add", "pref", "1000", "lookup", "local"]);
    }
    let _ = ip_quiet(&["rule", "del", "pref", "0"]);
    for (vlan, a, b) in RAILS {
        rail_routes(vlan, a, b);
    }
}

fn rule_present_pref(pref: &str, table: &str) -> bool {
    std::process::Command::new("/usr/bin/ip")
        .args(["rule", "show"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).lines().any(|l| {
                l.starts_with(&format!("{pref}:")) && l.contains(&format!("lookup {table}"))
            })
        })
        .unwrap_or(false)
}

fn tc(args: &[&str]) {
    let out = std::process::Command::new("/usr/sbin/tc")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("tc {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "tc {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tx_packets(dev: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{dev}/statistics/tx_packets"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Packets `dev` sends in `window` (is traffic on this rail?).
fn rail_rate(dev: &str, window: Duration) -> u64 {
    let before = tx_packets(dev);
    std::thread::sleep(window);
    tx_packets(dev).saturating_sub(before)
}

/// Wait until both devices list every rail address as a GID.
fn wait_for_rail_gids(v: &Verbs) {
    let until = Instant::now() + Duration::from_secs(10);
    for (dev, side) in [("rxe0", 1usize), ("rxe1", 2)] {
        let ctx = v.open(dev).expect("open");
        for (_, a, b) in RAILS {
            let addr: std::net::IpAddr = if side == 1 { a } else { b }.parse().expect("ip");
            while ctx
                .find_gid(1, addr, GidType::RoceV2)
                .ok()
                .flatten()
                .is_none()
            {
                assert!(
                    Instant::now() < until,
                    "{dev}: no GID for {addr} after 10 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A child process whose stdout or stderr is read line by line on a thread, so that a
/// test can wait for lines while the process runs. Every line is echoed with the
/// child's name and kept in `log`.
struct ChildLines {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    log: Vec<String>,
    name: &'static str,
}

impl ChildLines {
    /// Start `cmd` with stdin piped, and read its stderr (`stderr`; stdout is piped
    /// too, for the caller to collect at exit) or its stdout (stderr goes to the test's).
    fn spawn(mut cmd: std::process::Command, name: &'static str, stderr: bool) -> ChildLines {
        use std::io::BufRead;
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(if stderr {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::inherit()
            })
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let (tx, rx) = std::sync::mpsc::channel();
        let stream: Box<dyn std::io::Read + Send> = if stderr {
            Box::new(child.stderr.take().expect("piped"))
        } else {
            Box::new(child.stdout.take().expect("piped"))
        };
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        ChildLines {
            child,
            lines: rx,
            log: Vec::new(),
            name,
        }
    }

    /// The next line, before `until`; panics with the log so far when none comes.
    fn next_line(&mut self, until: Instant, waiting_for: &str) -> String {
        let left = until.saturating_duration_since(Instant::now());
        match self.lines.recv_timeout(left) {
            Ok(l) => {
                println!("  [{}] {l}", self.name);
                self.log.push(l.clone());
                l
            }
            Err(_) => {
                let _ = self.child.kill();
                panic!(
                    "{}: no line with {waiting_for:?} in time; log so far:\n{}",
                    self.name,
                    self.log.join("\n")
                )
            }
        }
    }

    /// Read lines until one contains `what`; returns when it came, and the line.
    fn wait_for(&mut self, what: &str, limit: Duration) -> (Instant, String) {
        let until = Instant::now() + limit;
        loop {
            let l = self.next_line(until, what);
            if l.contains(what) {
                return (Instant::now(), l);
            }
        }
    }

    /// How many lines were read so far (for [`ChildLines::wait_for_all_since`]).
    fn mark(&self) -> usize {
        self.log.len()
    }

    /// Wait until, since `mark`, a line containing each of `all` was printed, in any
    /// order (lines already read count).
    fn wait_for_all_since(&mut self, mark: usize, all: &[&str], limit: Duration) {
        let until = Instant::now() + limit;
        loop {
            let since = self.log.get(mark..).unwrap_or(&[]);
            let Some(missing) = all.iter().find(|w| !since.iter().any(|l| l.contains(*w))) else {
                return;
            };
            self.next_line(until, missing);
        }
    }

    /// Write a line to the child's stdin.
    fn write_line(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}").expect("write to the child");
        stdin.flush().expect("flush");
    }

    /// Close the child's stdin.
    fn close_stdin(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Wait for the child to exit (killed after `limit`), echoing what it still prints.
    fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let until = Instant::now() + limit;
        loop {
            while let Ok(l) = self.lines.try_recv() {
                println!("  [{}] {l}", self.name);
                self.log.push(l);
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                return st;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("{}: did not exit within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A running `apm pingpong`: its stderr lines as they come, its JSON report at the end.
struct Pingpong(ChildLines);

impl Pingpong {
    fn start(apm: &str, name: &'static str, args: &[&str]) -> Pingpong {
        let mut cmd = std::process::Command::new(apm);
        cmd.arg("pingpong")
            .args(args)
            .env("APM_LOG", "warn,provider_rxe=info");
        Pingpong(ChildLines::spawn(cmd, name, true))
    }

    /// Wait for a stderr line containing `what`; returns when it came.
    fn wait_for(&mut self, what: &str, limit: Duration) -> Instant {
        self.0.wait_for(what, limit).0
    }

    /// Stop sending: close stdin (the run ends once both sides have stopped).
    fn stop(&mut self) {
        self.0.close_stdin();
    }

    /// Wait for the report (JSON on stdout).
    fn finish(mut self, limit: Duration) -> serde_json::Value {
        self.stop();
        self.0.wait_exit(limit);
        let name = self.0.name;
        let out = self.0.child.wait_with_output().expect("wait");
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or("");
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{name}: no JSON report ({e}); stdout: {text}"))
    }
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn software_failover_keeps_every_message_through_cut_and_link_down() {
    if !link_toggle_allowed() {
        println!("SKIPPED: cuts rails; set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)");
        return;
    }
    let Some(apm) = std::env::var("APM_BIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
    else {
        println!("SKIPPED: APM_BIN does not name the apm binary (hwtest sets it)");
        return;
    };
    let v = verbs();
    let names = device_names(&v);
    if netdev_of("rxe0", 1).as_deref() != Some("vA")
        || netdev_of("rxe1", 1).as_deref() != Some("vB")
    {
        println!("SKIPPED: needs the VM layout (rxe0 on vA, rxe1 on vB); devices: {names:?}");
        return;
    }
    let t_setup = Instant::now();
    setup_rails();
    wait_for_rail_gids(&v);
    println!("rails up in {:?}", t_setup.elapsed());

    let common = [
        "--json",
        "--until-stdin-eof",
        "--interval-ms",
        "2",
        "--stall-ms",
        "300",
        "--control",
        "127.0.0.1:0",
    ];
    let mut server_args = vec![
        "--device",
        "rxe1",
        "--rail",
        "10.0.10.2",
        "--rail",
        "10.0.20.2",
    ];
    server_args.extend(["--listen", "127.0.0.1:18515"]);
    server_args.extend(common);
    let mut client_args = vec![
        "--device",
        "rxe0",
        "--rail",
        "10.0.10.1",
        "--rail",
        "10.0.20.1",
    ];
    client_args.extend(["--connect", "127.0.0.1:18515"]);
    client_args.extend(common);
    let mut server = Pingpong::start(&apm, "server", &server_args);
    let mut client = Pingpong::start(&apm, "client", &client_args);
    client.wait_for("qpn", Duration::from_secs(60));
    server.wait_for("qpn", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    let on10 = rail_rate("vA.10", Duration::from_millis(500));
    println!("before the cut: vA.10 sent {on10} packets in 0.5 s");
    assert!(on10 > 0, "traffic does not start on rail 10");

    // (a) Silent cut of rail 10 (A's side drops everything it sends).
    let cut = Instant::now();
    tc(&[
        "qdisc", "add", "dev", "vA.10", "root", "netem", "loss", "100%",
    ]);
    let moved = client.wait_for("FAILOVER", Duration::from_secs(20));
    server.wait_for("FAILOVER", Duration::from_secs(20));
    println!(
        "(a) netem loss 100% on vA.10: client failover {:?} after the cut",
        moved - cut
    );
    std::thread::sleep(Duration::from_millis(800));
    let on20 = rail_rate("vA.20", Duration::from_millis(500));
    println!("(a) after failover: vA.20 sent {on20} packets in 0.5 s");
    assert!(on20 > 0, "traffic did not move to rail 20");

    // The path returns: traffic stays where it is (apm re-arms rail 10 as the alternate).
    tc(&["qdisc", "del", "dev", "vA.10", "root"]);
    std::thread::sleep(Duration::from_millis(500));
    let back10 = rail_rate("vA.10", Duration::from_millis(500));
    let still20 = rail_rate("vA.20", Duration::from_millis(500));
    println!(
        "rail 10 restored: traffic returns to the original rail: {} (vA.10 {back10}, vA.20 \
         {still20} packets in 0.5 s); rail 10 is the re-armed alternate",
        if back10 > still20 { "yes" } else { "no" }
    );

    // (b) Link down on rail 20: the QP fails into ERR; apm re-initialises it on rail 10.
    let down = Instant::now();
    ip(&["link", "set", "vA.20", "down"]);
    let moved = client.wait_for("FAILOVER", Duration::from_secs(20));
    server.wait_for("FAILOVER", Duration::from_secs(20));
    println!(
        "(b) link vA.20 down: client failover {:?} after the link went down",
        moved - down
    );
    std::thread::sleep(Duration::from_millis(800));
    let on10 = rail_rate("vA.10", Duration::from_millis(500));
    println!("(b) after failover: vA.10 sent {on10} packets in 0.5 s (back on the original rail)");
    assert!(on10 > 0, "traffic did not move back to rail 10");
    ip(&["link", "set", "vA.20", "up"]);
    rail_routes(20, "10.0.20.1", "10.0.20.2");
    std::thread::sleep(Duration::from_millis(1000));

    client.stop();
    server.stop();
    let c = client.finish(Duration::from_secs(60));
    let s = server.finish(Duration::from_secs(60));
    for (name, r) in [("client", &c), ("server", &s)] {
        println!(
            "{name}: sent {} received {} (peer sent {}) lost {} duplicated {} out-of-order {} \
             longest stall {:.1} ms, stalls {}, failovers {}, drain {} reinit {}, flushed sends \
             replayed {} receives reposted {}, primary {} (was {})",
            r["sent"],
            r["received"],
            r["peer_sent"],
            r["lost"],
            r["duplicated"],
            r["out_of_order"],
            r["longest_stall_ms"].as_f64().unwrap_or(-1.0),
            r["stalls"],
            r["failovers"],
            r["drain_migrations"],
            r["reinit_migrations"],
            r["flushed_sends_replayed"],
            r["flushed_recvs_reposted"],
            r["final_primary"],
            r["initial_primary"],
        );
    }
    // The failover stall: the longest gap in arriving messages that began in the 3 s
    // before each failover was reported (the path was cut, then apm noticed and moved).
    for (name, r) in [("client", &c), ("server", &s)] {
        let stalls = r["stalls"].as_array().cloned().unwrap_or_default();
        let events = r["events"].as_array().cloned().unwrap_or_default();
        let mut seen = Vec::new();
        for e in events.iter().filter(|e| e["kind"] == "failover") {
            let t = e["at_ms"].as_f64().unwrap_or(0.0);
            let gap = stalls
                .iter()
                .filter(|g| {
                    let at = g["at_ms"].as_f64().unwrap_or(0.0);
                    t - 3000.0 <= at && at <= t
                })
                .filter_map(|g| g["ms"].as_f64())
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            seen.push(gap.map_or("under 100 ms".to_owned(), |g| format!("{g:.0} ms")));
        }
        println!("{name}: failover stalls (path cut to messages arriving again): {seen:?}");
    }
    for (name, r, peer) in [("client", &c, &s), ("server", &s, &c)] {
        assert_eq!(r["lost"], 0, "{name} lost messages");
        assert_eq!(r["duplicated"], 0, "{name} got duplicates");
        assert_eq!(r["received"], peer["sent"], "{name} did not receive all");
        assert!(
            r["failovers"].as_u64().unwrap_or(0) >= 2,
            "{name}: two failovers"
        );
        let rearms = r["events"]
            .as_array()
            .map_or(0, |e| e.iter().filter(|e| e["kind"] == "rearmed").count());
        assert!(rearms >= 1, "{name}: never re-armed after a failover");
    }
}

/// `apm watch` against a real port: one link down and up give exactly one `port_down`
/// and one `port_active` line (rxe's second PORT_ACTIVE is dropped), each with the port's
/// state read back after the event.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn apm_watch_prints_one_line_per_link_event_with_the_state_read_back() {
    if !link_toggle_allowed() {
        println!("SKIPPED: takes a link down; set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)");
        return;
    }
    let Some(apm) = std::env::var("APM_BIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
    else {
        println!("SKIPPED: APM_BIN does not name the apm binary (hwtest sets it)");
        return;
    };
    let v = verbs();
    let Some((name, netdev)) = device_names(&v)
        .into_iter()
        .find_map(|n| netdev_of(&n, 1).map(|d| (n, d)))
    else {
        println!("SKIPPED: no RoCE device with a netdev to take down");
        return;
    };
    let ctx = v.open(&name).expect("open");
    let mut child = std::process::Command::new(&apm)
        .args(["watch", "--json", "--device", &name, "--port", "1"])
        .args(["--timeout", "60"])
        // Debug logs show the duplicates dropped (rxe's second PORT_ACTIVE).
        .env("APM_LOG", "apm=debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("apm watch starts");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            println!("apm watch (stderr): {line}");
            let _ = tx.send(line);
        }
    });
    let ready = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("apm watch says what it watches");
    assert!(ready.contains("watching"), "{ready}");
    let wait_state = |want: PortState| {
        let until = Instant::now() + Duration::from_secs(10);
        while ctx.query_port(1).expect("query_port").state != want {
            assert!(
                Instant::now() < until,
                "{name} port 1 never became {want:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    ip(&["link", "set", &netdev, "down"]);
    wait_state(PortState::Down);
    std::thread::sleep(Duration::from_millis(300));
    ip(&["link", "set", &netdev, "up"]);
    wait_state(PortState::Active);
    // rxe's second PORT_ACTIVE comes ~1 ms after the first: give it time to show.
    std::thread::sleep(Duration::from_millis(500));
    let _ = child.kill();
    let out = child.wait_with_output().expect("apm watch output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("apm watch (stdout):\n{stdout}");
    let lines_of = |event: &str| -> Vec<String> {
        stdout
            .lines()
            .filter(|l| l.contains(&format!("\"event\":\"{event}\"")))
            .map(str::to_owned)
            .collect()
    };
    let downs = lines_of("port_down");
    let ups = lines_of("port_active");
    assert_eq!(downs.len(), 1, "exactly one port_down: {stdout}");
    assert_eq!(ups.len(), 1, "exactly one port_active: {stdout}");
    for (l, state) in [(&downs[0], "down"), (&ups[0], "active")] {
        assert!(l.contains(&format!("\"device\":\"{name}\"")), "{l}");
        assert!(l.contains("\"port\":1"), "{l}");
        assert!(l.contains(&format!("\"state\":\"{state}\"")), "{l}");
        assert!(l.contains("\"source\":\"verbs\""), "{l}");
        // RoCE: LID 0, SM LID 0, LMC 0, read back all the same.
        assert!(l.contains("\"lid\":0") && l.contains("\"sm_lid\":0"), "{l}");
    }
    wait_for_gid(&ctx, 1);
}

/// apm-capi's C example on rxe: a C program creates and connects its own RC QPs
/// (rxe0 <-> rxe1 over rail 10), hands each to its own apm manager through the C API
/// (rail 20 the agreed alternate), and exchanges 3000 numbered messages each way. Rail 10
/// is cut silently (netem) at message 1000: the program's watchdog reports the stall,
/// apm moves both QPs to rail 20 with the SQ drain; at 2000 rail 10 returns, both sides
/// re-arm it, rail 20 is cut and the connection moves back. Every message must arrive
/// once and in order, and each side must have migrated exactly twice.
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn c_example_connects_its_own_qps_and_hands_them_to_apm() {
    let Some(example) = std::env::var("APM_C_EXAMPLE")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
    else {
        println!("SKIPPED: APM_C_EXAMPLE does not name the C example (hwtest --vm sets it)");
        return;
    };
    if !link_toggle_allowed() {
        println!("SKIPPED: cuts rails; set APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm does)");
        return;
    }
    let v = verbs();
    let names = device_names(&v);
    if netdev_of("rxe0", 1).as_deref() != Some("vA")
        || netdev_of("rxe1", 1).as_deref() != Some("vB")
    {
        println!("SKIPPED: needs the VM layout (rxe0 on vA, rxe1 on vB); devices: {names:?}");
        return;
    }
    setup_rails();
    wait_for_rail_gids(&v);
    // Whatever happens, the rails are left without loss for the tests after this one.
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            for dev in ["vA.10", "vA.20"] {
                let _ = std::process::Command::new("/usr/sbin/tc")
                    .args(["qdisc", "del", "dev", dev, "root"])
                    .output();
            }
        }
    }
    let _restore = Restore;

    let mut cmd = std::process::Command::new(&example);
    cmd.env("APM_LOG", "warn,provider_rxe=info").args([
        "rxe0",
        "rxe1",
        "10.0.10.1",
        "10.0.10.2",
        "10.0.20.1",
        "10.0.20.2",
        "3000",
        "--pause-at",
        "1000",
        "--pause-at",
        "2000",
    ]);
    let mut c = ChildLines::spawn(cmd, "c", false);
    c.wait_for("connected rxe0 qpn", Duration::from_secs(30));
    c.wait_for("protection active", Duration::from_secs(30));

    // (a) Silent cut of rail 10: nothing tells apm but the application's stall report.
    c.wait_for("paused at 1000", Duration::from_secs(120));
    let on10 = rail_rate("vA.10", Duration::from_millis(200));
    println!("(a) idle on rail 10 before the cut: vA.10 sent {on10} packets in 0.2 s");
    tc(&[
        "qdisc", "add", "dev", "vA.10", "root", "netem", "loss", "100%",
    ]);
    c.write_line("");
    c.wait_for("reporting a stall to apm", Duration::from_secs(30));
    let mark = c.mark();
    c.wait_for_all_since(
        mark,
        &[
            "apm rxe0: conn 1 migrated, primary now 10.0.20.1 -> 10.0.20.2",
            "apm rxe1: conn 2 migrated, primary now 10.0.20.2 -> 10.0.20.1",
        ],
        Duration::from_secs(30),
    );
    let on20 = rail_rate("vA.20", Duration::from_millis(300));
    println!("(a) after the failover: vA.20 sent {on20} packets in 0.3 s");
    assert!(on20 > 0, "traffic did not move to rail 20");

    // (b) Rail 10 returns: both sides re-arm it as the alternate (the re-arm may have
    // come already, before the pause: apm cannot see a RoCE rail die, so it re-arms a
    // path once its hold-down ends); then rail 20 is cut and the connection moves back.
    let mark = c.mark();
    c.wait_for("paused at 2000", Duration::from_secs(120));
    tc(&["qdisc", "del", "dev", "vA.10", "root"]);
    c.wait_for_all_since(
        mark,
        &[
            "apm rxe0: conn 1 rearmed, alternate 10.0.10.1 -> 10.0.10.2",
            "apm rxe1: conn 2 rearmed, alternate 10.0.10.2 -> 10.0.10.1",
        ],
        Duration::from_secs(60),
    );
    tc(&[
        "qdisc", "add", "dev", "vA.20", "root", "netem", "loss", "100%",
    ]);
    c.write_line("");
    let mark = c.mark();
    c.wait_for_all_since(
        mark,
        &[
            "apm rxe0: conn 1 migrated, primary now 10.0.10.1 -> 10.0.10.2",
            "apm rxe1: conn 2 migrated, primary now 10.0.10.2 -> 10.0.10.1",
        ],
        Duration::from_secs(30),
    );
    let (_, summary) = c.wait_for("exchanged 3000 messages each way", Duration::from_secs(120));
    assert!(
        summary.contains("all arrived once and in order"),
        "{summary}"
    );
    assert!(
        summary.contains("migrations rxe0 2, rxe1 2"),
        "each side moved twice: {summary}"
    );
    let status = c.wait_exit(Duration::from_secs(30));
    assert_eq!(
        status.code(),
        Some(0),
        "the C example failed; log:\n{}",
        c.log.join("\n")
    );
}

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
// `apm run` with unmodified Debian programs (ibv_rc_pingpong, perftest, rping).
#[path = "hw/apm_run.rs"]
mod apm_run;
