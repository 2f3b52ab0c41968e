//! apm's hardware path on an APM-capable RoCE device (the patched soft-RoCE of
//! `kernel/rxe-apm`, the VM suite's second phase): `apm pingpong --mode hardware`
//! through a silent cut and a link down, and the library's `provider = "verbs"`
//! deployment with application QPs through both kinds of move and the re-arm after
//! each. Each test skips with the reason where the kernel refuses alternate paths
//! (stock rxe).

use super::apm_plan::{roce_plan, Plan};
use super::hardware_apm::{ib_connect, ib_wait_armed};
use super::pingpong_cuts;
use super::rails::tc;
use super::*;
use apm_core::{ConnId, ConnSpec, MigrationMode, Notification, NotificationKind, Qpn, Role};

/// Hardware APM here, or why not.
fn hardware_apm_here(v: &Verbs) -> Result<(), String> {
    let ctx = v.open("rxe0").map_err(|e| e.to_string())?;
    hw_apm::available(&ctx, 1).map_err(|e| e.to_string())
}

/// `apm pingpong --mode hardware` between rxe1 and rxe0 over rails 10 and 20: rail 10
/// cut silently (netem), restored, then rail 20's link taken down and brought back.
/// Each time the QPs migrate by themselves when their retries on the dead rail run out
/// (`IBV_EVENT_PATH_MIG` on both sides: "the device migrated"), apm arms the rail they
/// left at once, and the connection ends on rail 10 again, re-armed.
/// Every message arrives once and in order. (No `PORT_ERR` on rxe here: one rxe port
/// carries both rails, so a rail's link going down is no port event.)
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_pingpong_survives_cut_and_link_down() {
    let (apm, v) = match pingpong_cuts::prerequisites() {
        Ok(p) => p,
        Err(why) => return println!("SKIPPED roce_hw_apm: {why}"),
    };
    if let Err(why) = hardware_apm_here(&v) {
        return println!("SKIPPED roce_hw_apm: no hardware APM on rxe0: {why}");
    }
    let rearmed = |c: &mut super::child::Pingpong, s: &mut super::child::Pingpong| {
        let t = Instant::now();
        c.wait_for("re-armed", Duration::from_secs(30));
        s.wait_for("re-armed", Duration::from_secs(30));
        println!(
            "both sides re-armed {:?} after the rail came back",
            t.elapsed()
        );
    };
    let reports = pingpong_cuts::run(&apm, &v, "hardware", rearmed);
    pingpong_cuts::check("hardware", &reports);
    for (name, r) in ["client", "server"].iter().zip(&reports) {
        let device = r["events"].as_array().map_or(0, |e| {
            e.iter()
                .filter(|e| e["kind"] == "failover" && e["how"] == "device")
                .count()
        });
        assert!(
            device >= 2,
            "{name}: the device did not migrate by itself both times: {}",
            r["events"]
        );
    }
}

/// Two `Apm`s (`provider = "verbs"`, LAP/APR over UDP on loopback), one per device, as
/// two hosts would run them; each protects an application QP created on its context.
struct Deployment {
    rt: tokio::runtime::Runtime,
    apms: [apm::Apm; 2],
    notes: [tokio::sync::broadcast::Receiver<Notification>; 2],
    /// Notifications seen so far, per side, with the time they came.
    seen: [Vec<(Instant, NotificationKind)>; 2],
}

const LAP_PORTS: [u16; 2] = [18611, 18612];

impl Deployment {
    fn start() -> Deployment {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let config = |dev: &str, me: usize| {
            let peer = 1 - me;
            let peer_ip = ["10.0.10.1", "10.0.10.2"][peer];
            let peer_ip2 = ["10.0.20.1", "10.0.20.2"][peer];
            let text = format!(
                "[[device]]\nname = \"{dev}\"\nprovider = \"verbs\"\n\n[lap]\ntransport = \
                 \"udp\"\nudp_listen = \"127.0.0.1:{}\"\n[[lap.peer]]\ngid = \"::ffff:{peer_ip}\"\n\
                 addr = \"127.0.0.1:{}\"\n[[lap.peer]]\ngid = \"::ffff:{peer_ip2}\"\naddr = \
                 \"127.0.0.1:{}\"\n",
                LAP_PORTS[me], LAP_PORTS[peer], LAP_PORTS[peer]
            );
            apm::Config::parse(&text).unwrap_or_else(|e| panic!("config {dev}: {e:?}"))
        };
        let apms = rt.block_on(async {
            let a = apm::Apm::start(&config("rxe0", 0))
                .await
                .expect("apm on rxe0");
            let b = apm::Apm::start(&config("rxe1", 1))
                .await
                .expect("apm on rxe1");
            [a, b]
        });
        let notes = [apms[0].notifications(), apms[1].notifications()];
        Deployment {
            rt,
            apms,
            notes,
            seen: [Vec::new(), Vec::new()],
        }
    }

    /// Read what has come; true once side `k` has a notification `want` accepts.
    fn saw(&mut self, k: usize, want: &dyn Fn(&NotificationKind) -> bool) -> bool {
        for side in 0..2 {
            while let Ok(n) = self.notes[side].try_recv() {
                println!("  apm {}: {:?}", ["A", "B"][side], n.kind);
                self.seen[side].push((Instant::now(), n.kind));
            }
        }
        self.seen[k].iter().any(|(_, n)| want(n))
    }

    /// Wait until side `k` notifies `what`, running `idle` (traffic) meanwhile.
    fn wait(
        &mut self,
        k: usize,
        what: &str,
        want: &dyn Fn(&NotificationKind) -> bool,
        limit: Duration,
        idle: &mut dyn FnMut(),
    ) -> Instant {
        let start = Instant::now();
        while !self.saw(k, want) {
            assert!(
                start.elapsed() < limit,
                "apm {}: no {what} within {limit:?}; seen: {:?}",
                ["A", "B"][k],
                self.seen[k]
            );
            idle();
            std::thread::sleep(Duration::from_millis(5));
        }
        self.seen[k]
            .iter()
            .find(|(_, n)| want(n))
            .map_or(start, |(t, _)| *t)
    }

    /// What each side notified since `from`, in order, with the time since `from`.
    fn timeline(&self, from: Instant) -> String {
        let mut all: Vec<(Duration, &str, String)> = Vec::new();
        for (k, side) in self.seen.iter().enumerate() {
            for (t, n) in side {
                let short = match n {
                    NotificationKind::Migrated { forced, .. } => {
                        format!("migrated{}", if *forced { " (forced)" } else { "" })
                    }
                    NotificationKind::Unprotected { reason, .. } => {
                        format!("unprotected ({reason:?})")
                    }
                    NotificationKind::Rearmed { .. } => "re-armed".into(),
                    NotificationKind::Protected { .. } => "protected".into(),
                    other => format!("{other:?}"),
                };
                all.push((t.saturating_duration_since(from), ["A", "B"][k], short));
            }
        }
        all.sort();
        all.iter()
            .map(|(t, side, what)| format!("{side} {what} at {:.0} ms", t.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn forget(&mut self) {
        let _ = self.saw(0, &|_| false);
        self.seen = [Vec::new(), Vec::new()];
    }
}

fn migrated(n: &NotificationKind) -> bool {
    matches!(n, NotificationKind::Migrated { .. })
}

fn rearmed(n: &NotificationKind) -> bool {
    matches!(
        n,
        NotificationKind::Rearmed { .. } | NotificationKind::Protected { .. }
    )
}

/// The connection as each side describes it to apm: primary rail 10, rail 20 agreed.
fn specs(plan: &Plan, a: &End, b: &End) -> [ConnSpec; 2] {
    let qpn = |e: &End| Qpn::new(e.qp.qp_num()).expect("QPN");
    let mtu = 3; // 1024, as `ib_connect` sets it
    let path = |p: super::apm_plan::PathEnd| p.engine_path(0, 0, mtu, 14);
    [
        (&plan.a, a, b, Role::Active),
        (&plan.b, b, a, Role::Passive),
    ]
    .map(|(side, me, peer, role)| ConnSpec {
        id: ConnId(1),
        role,
        mode: MigrationMode::Hardware,
        local_qpn: qpn(me),
        remote_qpn: qpn(peer),
        local_comm_id: if role == Role::Active { 0xA1 } else { 0xB1 },
        remote_comm_id: if role == Role::Active { 0xB1 } else { 0xA1 },
        primary: path(side.primary),
        agreed_alternate: Some(path(side.alternate)),
        candidates: vec![path(side.alternate)],
    })
}

/// The rail (10 or 20) a QP's primary, or its alternate, runs on, from the GID index.
fn rail_of(plan: &Plan, k: usize, av: &AddressVector) -> u16 {
    let side = if k == 0 { &plan.a } else { &plan.b };
    if side.primary.is(av, 1) {
        10
    } else if side.alternate.is(av, 1) {
        20
    } else {
        0
    }
}

/// The library's `provider = "verbs"` deployment on the APM-capable rxe pair, with the
/// application's own QPs (created on each Apm's context, so that their async events
/// reach apm) registered through `Apm::protect_qp`, on real verbs:
///
/// 1. apm arms the agreed alternate (rail 20) on both sides: ARMED after traffic.
/// 2. A move apm makes: the application on A reports a stall while nothing is sent;
///    A's engine asks B over rail 20 to move first (`Migrate`, a probe), B's QP is
///    forced to MIGRATED, and A's follows on B's answer: both on rail 20 before any
///    traffic (a device moves by itself only on a packet with MigReq=1). Both arm rail
///    10, the rail they left, at once, and are ARMED again once traffic flows.
/// 3. A move the devices make: rail 20 cut silently under traffic; both QPs migrate by
///    themselves when their retries run out (or on the peer's first MigReq=1 packet),
///    both engines arm the dead rail 20 at once, and both are ARMED on it again once it
///    returns.
///
/// Every message arrives once and in order throughout (the exchange checks each).
#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn roce_hw_apm_library_deployment_and_rearm_races() {
    const TEST: &str = "roce_hw_apm_library";
    let v = verbs();
    let plan = match roce_plan(&v) {
        Ok(p) => p,
        Err(why) => return println!("SKIPPED {TEST}: {why}"),
    };
    println!("{TEST}: {}", plan.how);
    let mut d = Deployment::start();
    let mut a = End::on(d.apms[0].contexts()[0].clone());
    let mut b = End::on(d.apms[1].contexts()[0].clone());
    ib_connect(&a, &b, &plan, false);
    exchange(&mut a, &mut b, 50);
    let [sa, sb] = specs(&plan, &a, &b);
    d.rt.block_on(async {
        d.apms[0]
            .protect_qp(sa, a.qp.clone())
            .await
            .expect("protect A");
        d.apms[1]
            .protect_qp(sb, b.qp.clone())
            .await
            .expect("protect B");
    });
    for k in 0..2 {
        d.wait(
            k,
            "protected",
            &rearmed,
            Duration::from_secs(10),
            &mut || {},
        );
    }
    let t = ib_wait_armed(&mut a, &mut b);
    println!("(1) protected through the library: both ARMED on rail 20 after {t:?} of traffic");

    // (2) A reports a stall while idle: B is asked to move first, A follows.
    d.forget();
    let forced = Instant::now();
    d.rt.block_on(d.apms[0].report_stall(ConnId(1)))
        .expect("report_stall");
    let mut moved = [forced; 2];
    for (k, side) in [(1, "B"), (0, "A")] {
        moved[k] = d.wait(
            k,
            &format!("{side} migrated"),
            &migrated,
            Duration::from_secs(5),
            &mut || {},
        );
    }
    println!(
        "(2) after the report, as the test read it: B migrated after {:?}, A after {:?}",
        moved[1] - forced,
        moved[0] - forced
    );
    // With no traffic neither device could have moved by itself (nothing with MigReq=1
    // was sent): both QPs on rail 20 means apm moved both, B on A's probe. (A forced
    // migration raises PATH_MIG on the patched rxe too, so `forced` in the notification
    // says which of the event and the command's result the engine saw first.)
    for (k, e) in [&a, &b].into_iter().enumerate() {
        let rail = rail_of(
            &plan,
            k,
            &e.qp.query(QpAttrMask::AV).expect("query").ah_attr,
        );
        assert_eq!(rail, 20, "{}: moved by apm with no traffic", e.ctx.name());
    }
    let (aa, bb) = (&mut a, &mut b);
    let mut traffic = || exchange(aa, bb, 4);
    for k in 0..2 {
        d.wait(
            k,
            "re-armed",
            &rearmed,
            Duration::from_secs(20),
            &mut traffic,
        );
    }
    let t = ib_wait_armed(aa, bb);
    for (k, e) in [&*aa, &*bb].into_iter().enumerate() {
        let q =
            e.qp.query(QpAttrMask::AV | QpAttrMask::ALT_PATH)
                .expect("query");
        let (p, alt) = (
            rail_of(&plan, k, &q.ah_attr),
            rail_of(&plan, k, &q.alt_ah_attr),
        );
        println!(
            "(2) {}: primary rail {p}, alternate rail {alt}",
            e.ctx.name()
        );
        assert_eq!(
            (p, alt),
            (20, 10),
            "{}: moved to rail 20, re-armed on 10",
            e.ctx.name()
        );
    }
    println!("(2) both re-armed with rail 10; ARMED again {t:?} later");
    println!(
        "(2) timeline from the report, as the test read it: {}",
        d.timeline(forced)
    );

    // (3) Rail 20 cut under traffic: both migrate by themselves and arm it at once.
    d.forget();
    tc(&[
        "qdisc", "add", "dev", "vA.20", "root", "netem", "loss", "100%",
    ]);
    let cut = Instant::now();
    let mut traffic = || exchange(aa, bb, 4);
    for k in 0..2 {
        d.wait(
            k,
            "migrated",
            &migrated,
            Duration::from_secs(20),
            &mut traffic,
        );
    }
    println!("(3) rail 20 cut: both migrated by {:?}", cut.elapsed());
    for k in 0..2 {
        d.wait(
            k,
            "re-armed",
            &rearmed,
            Duration::from_secs(30),
            &mut traffic,
        );
    }
    println!(
        "(3) timeline from the cut, as the test read it: {}",
        d.timeline(cut)
    );
    tc(&["qdisc", "del", "dev", "vA.20", "root"]);
    let t = ib_wait_armed(aa, bb);
    for (k, e) in [&*aa, &*bb].into_iter().enumerate() {
        let q =
            e.qp.query(QpAttrMask::AV | QpAttrMask::ALT_PATH)
                .expect("query");
        let (p, alt) = (
            rail_of(&plan, k, &q.ah_attr),
            rail_of(&plan, k, &q.alt_ah_attr),
        );
        assert_eq!(
            (p, alt),
            (10, 20),
            "{}: back on rail 10, re-armed on 20",
            e.ctx.name()
        );
    }
    exchange(aa, bb, 200);
    println!("(3) both back on rail 10, re-armed with rail 20 (ARMED {t:?} after the rail came back); passed");
    let Deployment { rt, apms, .. } = d;
    rt.block_on(async {
        for apm in apms {
            apm.shutdown().await.expect("shutdown");
        }
    });
}
