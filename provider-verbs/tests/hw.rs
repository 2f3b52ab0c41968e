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
        let port = 1;
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

/// Move both QPs RESET -> INIT -> RTR -> RTS, each pointing at the other.
fn connect(a: &End, b: &End) {
    for (me, peer, my_psn, peer_psn) in [(a, b, PSN_A, PSN_B), (b, a, PSN_B, PSN_A)] {
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: me.port,
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
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: my_psn,
            timeout: 14,
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

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn hardware_apm_on_roce_is_refused_up_front() {
    let v = verbs();
    let (mut a, mut b) = pair(&v);
    if a.gid.is_none() {
        println!(
            "SKIPPED: {} port {} is InfiniBand: hardware APM on InfiniBand (arm, forced \
             migration, PATH_MIG, rearm) needs two IB ports and is not in this suite yet",
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

/// A running `apm pingpong` with its stderr lines forwarded.
struct Pingpong {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    log: Vec<String>,
    name: &'static str,
}

impl Pingpong {
    fn start(apm: &str, name: &'static str, args: &[&str]) -> Pingpong {
        use std::io::BufRead;
        let mut child = std::process::Command::new(apm)
            .arg("pingpong")
            .args(args)
            .env("APM_LOG", "warn,provider_rxe=info")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {apm}: {e}"));
        let (tx, rx) = std::sync::mpsc::channel();
        let err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Pingpong {
            child,
            lines: rx,
            log: Vec::new(),
            name,
        }
    }

    /// Wait for a stderr line containing `what`; returns when it came.
    fn wait_for(&mut self, what: &str, limit: Duration) -> Instant {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    println!("  [{}] {l}", self.name);
                    let hit = l.contains(what);
                    self.log.push(l);
                    if hit {
                        return Instant::now();
                    }
                }
                Err(_) => panic!(
                    "{}: no line with {what:?} within {limit:?}; log so far:\n{}",
                    self.name,
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Stop sending: close stdin (the run ends once both sides have stopped).
    fn stop(&mut self) {
        drop(self.child.stdin.take());
    }

    /// Wait for the report (JSON on stdout).
    fn finish(mut self, limit: Duration) -> serde_json::Value {
        self.stop();
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("{}: did not finish within {limit:?}", self.name);
            }
            while let Ok(l) = self.lines.try_recv() {
                println!("  [{}] {l}", self.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        while let Ok(l) = self.lines.try_recv() {
            println!("  [{}] {l}", self.name);
        }
        let out = self.child.wait_with_output().expect("wait");
        let text = String::from_utf8_lossy(&out.stdout);
        let last = text.lines().last().unwrap_or("");
        serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("{}: no JSON report ({e}); stdout: {text}", self.name))
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
/// (rxe0 <-> rxe1), exchanges messages, and hands the QPs to apm through the C API.
///
/// What it shows today, precisely: the QPs work, and apm's library refuses an rxe
/// deployment with `APM_STATUS_UNSUPPORTED` (provider-rxe migrates only connections whose
/// sends and receives it numbers itself, `RcConn`; a QP the application posts to
/// directly cannot be replayed). The example then says "protection NOT active" and exits
/// 3; this test checks exactly that, so that it fails, and is extended to the path cut,
/// the day protection becomes active.
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
    let v = verbs();
    let names = device_names(&v);
    if !names.iter().any(|n| n == "rxe0") || !names.iter().any(|n| n == "rxe1") {
        println!("SKIPPED: needs rxe0 and rxe1 (the VM layout); devices: {names:?}");
        return;
    }
    for dev in ["rxe0", "rxe1"] {
        wait_for_gid(&v.open(dev).expect("open"), 1);
    }
    let out = std::process::Command::new(&example)
        .args(["rxe0", "rxe1", "100"])
        .output()
        .expect("the C example runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!(
        "C example (exit {:?}):\n{stdout}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("connected rxe0 qpn"), "{stdout}");
    assert!(
        stdout.contains("exchanged 100 messages each way"),
        "{stdout}"
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "protection is not available for application-owned QPs on rxe yet: expected the \
         example to say so (exit 3); if it is active now, extend this test to cut a path"
    );
    assert!(
        stdout.contains("protection NOT active") && stdout.contains("rxe deployments cannot"),
        "{stdout}"
    );
}
