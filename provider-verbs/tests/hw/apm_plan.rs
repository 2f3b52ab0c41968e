//! Where the hardware-APM tests can run, and the two paths of each end there: two
//! InfiniBand ports on one subnet (another port, or another LID with LMC > 0, for the
//! alternate), or two RoCE devices whose kernel accepts alternate paths, with the VM's
//! rails (rail 10 the primary, rail 20 the alternate: the patched soft-RoCE of
//! `kernel/rxe-apm` in the VM suite's second phase).

use super::rails::{setup_rails, wait_for_rail_gids, RAILS};
use super::*;

/// One path as one end sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathEnd {
    /// InfiniBand: leaves `port` with source path `bits` (LMC offset) for `dlid`.
    Ib { port: u8, bits: u8, dlid: u16 },
    /// RoCE: leaves `port` from the GID at `sgid_index` (`sgid`) for `dgid`.
    Roce {
        port: u8,
        sgid_index: u8,
        sgid: [u8; 16],
        dgid: [u8; 16],
    },
}

impl PathEnd {
    /// The local port.
    pub(crate) fn port(self) -> u8 {
        match self {
            PathEnd::Ib { port, .. } | PathEnd::Roce { port, .. } => port,
        }
    }

    /// The address vector of the path.
    pub(crate) fn av(self) -> AddressVector {
        match self {
            PathEnd::Ib { port, bits, dlid } => AddressVector {
                dlid,
                port_num: port,
                src_path_bits: bits,
                ..AddressVector::default()
            },
            PathEnd::Roce {
                port,
                sgid_index,
                dgid,
                ..
            } => AddressVector {
                port_num: port,
                is_global: true,
                dgid,
                sgid_index,
                hop_limit: 64,
                ..AddressVector::default()
            },
        }
    }

    /// Is `av` (read back from a QP whose port is `port`) this path?
    pub(crate) fn is(self, av: &AddressVector, port: u8) -> bool {
        match self {
            PathEnd::Ib { port: p, dlid, .. } => (port, av.dlid) == (p, dlid),
            PathEnd::Roce {
                sgid_index, dgid, ..
            } => (av.sgid_index, av.dgid) == (sgid_index, dgid),
        }
    }

    /// The path as apm's engine describes it, on device index `dev`; `slid` is the
    /// source LID (InfiniBand: the port's base LID plus the path bits).
    pub(crate) fn engine_path(
        self,
        dev: u16,
        slid: u16,
        mtu: u8,
        ack_timeout: u8,
    ) -> apm_core::Path {
        let none = (apm_core::Lid::from_wire(0), apm_core::Gid::default());
        let mut p = apm_core::Path::ib(
            apm_core::PortKey::new(dev, self.port()),
            none,
            none,
            mtu,
            ack_timeout,
        );
        match self {
            PathEnd::Ib { dlid, .. } => {
                p.slid = apm_core::Lid::from_wire(slid);
                p.dlid = apm_core::Lid::from_wire(dlid);
            }
            PathEnd::Roce {
                sgid_index,
                sgid,
                dgid,
                ..
            } => {
                p.sgid = apm_core::Gid(sgid);
                p.dgid = apm_core::Gid(dgid);
                p.sgid_index = sgid_index;
                p.hop_limit = 64;
            }
        }
        p
    }
}

impl std::fmt::Display for PathEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PathEnd::Ib { port, bits, dlid } => {
                write!(f, "port {port} (path bits {bits}) -> LID {dlid}")
            }
            PathEnd::Roce { sgid, dgid, .. } => write!(
                f,
                "{} -> {}",
                std::net::Ipv6Addr::from(*sgid),
                std::net::Ipv6Addr::from(*dgid)
            ),
        }
    }
}

/// One end's two paths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Side {
    pub(crate) primary: PathEnd,
    pub(crate) alternate: PathEnd,
}

impl Side {
    /// InfiniBand paths, each (local port, source path bits, remote LID).
    fn ib(primary: (u8, u8, u16), alternate: (u8, u8, u16)) -> Side {
        let end = |(port, bits, dlid)| PathEnd::Ib { port, bits, dlid };
        Side {
            primary: end(primary),
            alternate: end(alternate),
        }
    }
}

/// Two ends that can reach each other, and each one's primary and alternate paths.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) a_dev: String,
    pub(crate) b_dev: String,
    pub(crate) a: Side,
    pub(crate) b: Side,
    pub(crate) mtu: Mtu,
    /// How the alternate path differs from the primary.
    pub(crate) how: String,
    /// The alternate path leaves through other ports, or other GIDs (not only other LIDs
    /// of the same InfiniBand ports).
    pub(crate) two_ports: bool,
}

/// The skip line of the hardware-APM tests: what this machine lacks.
pub(crate) fn skip(test: &str, why: &str) {
    println!("SKIPPED {test}: {why}");
}

/// Where hardware APM can be tested here: InfiniBand ports first, else an APM-capable
/// RoCE pair with the VM's rails; the error says why neither (the skip reason).
pub(crate) fn plan(v: &Verbs) -> Result<Plan, String> {
    let ib = match ib_plan(v) {
        Ok(p) => return Ok(p),
        Err(why) => why,
    };
    roce_plan(v).map_err(|roce| format!("{ib}; and on RoCE: {roce}"))
}

/// The VM's two rxe devices (rxe0 on vA, rxe1 on vB) when their kernel accepts
/// alternate paths: rail 10 as the primary, rail 20 as the alternate (rails set up here,
/// which takes links down and up: only where that is allowed).
pub(crate) fn roce_plan(v: &Verbs) -> Result<Plan, String> {
    if netdev_of("rxe0", 1).as_deref() != Some("vA")
        || netdev_of("rxe1", 1).as_deref() != Some("vB")
    {
        return Err("no rxe0 on vA and rxe1 on vB (the VM layout)".into());
    }
    let open = |n: &str| v.open(n).map_err(|e| format!("open {n}: {e}"));
    let (a, b) = (open("rxe0")?, open("rxe1")?);
    for ctx in [&a, &b] {
        hw_apm::available(ctx, 1).map_err(|e| e.to_string())?;
    }
    if !link_toggle_allowed() {
        return Err("the rails need APM_HWTEST_LINK_TOGGLE=1 (hwtest --vm sets it)".into());
    }
    setup_rails();
    wait_for_rail_gids(v);
    let gid = |ctx: &Context, ip: &str| -> Result<(u8, [u8; 16]), String> {
        let addr: std::net::IpAddr = ip.parse().map_err(|e| format!("{ip}: {e}"))?;
        let e = ctx
            .find_gid(1, addr, GidType::RoceV2)
            .map_err(|e| e.to_string())?
            .ok_or(format!("{}: no GID for {ip}", ctx.name()))?;
        Ok((
            u8::try_from(e.index).map_err(|_| "GID index above 255")?,
            e.gid,
        ))
    };
    let mut sides = Vec::new();
    for (ctx, me, peer) in [(&a, 1usize, 2usize), (&b, 2, 1)] {
        let mut ends = Vec::new();
        for (_, ip_a, ip_b) in RAILS {
            let ips = [ip_a, ip_b];
            let (sgid_index, sgid) = gid(ctx, ips[me - 1])?;
            let remote: std::net::IpAddr = ips[peer - 1].parse().map_err(|e| format!("{e}"))?;
            let dgid = match remote {
                std::net::IpAddr::V4(r) => r.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(r) => r.octets(),
            };
            ends.push(PathEnd::Roce {
                port: 1,
                sgid_index,
                sgid,
                dgid,
            });
        }
        sides.push(Side {
            primary: ends[0],
            alternate: ends[1],
        });
    }
    Ok(Plan {
        a_dev: "rxe0".into(),
        b_dev: "rxe1".into(),
        a: sides[0],
        b: sides[1],
        mtu: Mtu::Mtu1024,
        how: format!(
            "rxe0 <-> rxe1 (RoCE, the kernel accepts alternate paths): primary {}, alternate {}",
            sides[0].primary, sides[0].alternate
        ),
        two_ports: true,
    })
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

/// Pick two InfiniBand ports on one subnet with a distinct alternate path, or say why
/// there are none (the skip reason).
pub(crate) fn ib_plan(v: &Verbs) -> Result<Plan, String> {
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
            return Ok(Plan {
                a_dev: x.dev.clone(),
                b_dev: y.dev.clone(),
                a: Side::ib((x.port, 0, y.lid), (y.port, 0, x.lid)),
                b: Side::ib((y.port, 0, x.lid), (x.port, 0, y.lid)),
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
            return Ok(Plan {
                a_dev: x.dev.clone(),
                b_dev: y.dev.clone(),
                a: Side::ib((x.port, 0, y.lid), (x2.port, 0, y2.lid)),
                b: Side::ib((y.port, 0, x.lid), (y2.port, 0, x2.lid)),
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
            return Ok(Plan {
                a_dev: x.dev.clone(),
                b_dev: y.dev.clone(),
                a: Side::ib((x.port, 0, y.lid), (x.port, xb, y.lid + u16::from(yb))),
                b: Side::ib((y.port, 0, x.lid), (y.port, yb, x.lid + u16::from(xb))),
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
