//! Forged peer messages in the VM: a stranger on the host sends `apm pingpong`'s server
//! datagrams that claim to come from its client. apm's peer channel on RoCE is UDP, and
//! a datagram's sender is its source address: a raw socket writes the UDP header itself,
//! so the forger puts the client's control address (127.0.0.1 and the client's port) on
//! what it sends, as anyone on a rail can with its peers' addresses.
//!
//! - Without a key, a forged `Migrate` (intent probe, the path the server's alternate
//!   takes) is a message from the peer: the server moves its QP onto the alternate and
//!   answers, with nothing wrong on the path. That is the denial of service a stranger
//!   can do to an unauthenticated deployment.
//! - With `--peer-key` on both sides, the same forged `Migrate` (no MAC), one sealed
//!   under another key, and truncated and oversized datagrams are all dropped before
//!   they are decoded and counted (`peer_datagrams_dropped`), and nothing moves; the
//!   traffic runs on, none lost or duplicated.

use super::child::Pingpong;
use super::pingpong_cuts::prerequisites;
use super::rails::*;
use super::*;
use apm_core::{Gid, Migrate, MigrateIntent, Path, PeerMsg, PortKey};

/// The control ports of the two sides (fixed, so the forger knows whom to imitate).
const SERVER_CONTROL: u16 = 47980;
const CLIENT_CONTROL: u16 = 47981;
/// `apm pingpong`'s comm ids (the client's, the server's).
const CLIENT_COMM_ID: u32 = 0xC11E_0001;
const SERVER_COMM_ID: u32 = 0x5E4E_0001;

fn roce_gid(a: [u8; 4]) -> Gid {
    Gid(std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets())
}

/// The `Migrate` the client would send to move both onto rail 20 (its own view).
fn forged_migrate() -> [u8; 256] {
    let path = Path::roce(
        PortKey::new(0, 1),
        roce_gid([10, 0, 20, 1]),
        roce_gid([10, 0, 20, 2]),
        Path::MTU_1024,
        Path::ACK_TIMEOUT_67MS,
    );
    let msg = PeerMsg::Migrate(Migrate {
        sender_comm_id: CLIENT_COMM_ID,
        receiver_comm_id: SERVER_COMM_ID,
        path,
        intent: MigrateIntent::Probe,
    });
    cm_lap::apm_msg::encode(
        cm_lap::umad_transport::DEFAULT_VENDOR_CLASS,
        cm_lap::udp::UDP_DEFAULT_OUI,
        0x4242_0001,
        &msg,
    )
    .expect("encode")
}

/// Send `payload` to 127.0.0.1:`to` as a UDP datagram from 127.0.0.1:`from`, through a
/// raw socket (root): the kernel writes the IP header, the UDP header is ours (checksum
/// 0: none, which IPv4 allows).
#[allow(unsafe_code)] // socket(2)/sendto(2) on a raw socket: std has no raw sockets
fn spoof(from: u16, to: u16, payload: &[u8]) {
    let mut d = Vec::with_capacity(8 + payload.len());
    d.extend_from_slice(&from.to_be_bytes());
    d.extend_from_slice(&to.to_be_bytes());
    let len = u16::try_from(8 + payload.len()).expect("a small datagram");
    d.extend_from_slice(&len.to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(payload);
    let dest = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: plain socket calls on a descriptor this function owns; the buffer and the
    // address outlive the calls and their lengths are theirs.
    let sent = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_UDP);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let n = libc::sendto(
            fd,
            d.as_ptr().cast(),
            d.len(),
            0,
            std::ptr::addr_of!(dest).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        libc::close(fd);
        n
    };
    assert_eq!(
        usize::try_from(sent).ok(),
        Some(d.len()),
        "raw sendto: {}",
        std::io::Error::last_os_error()
    );
}

/// A key file for `--peer-key` (mode 0600).
fn key_file(path: &str, secret: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, secret).expect("key");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Both sides over the two rails, each with its fixed control port; `key` on both.
fn start(apm: &str, key: Option<&str>, tcp: u16) -> (Pingpong, Pingpong) {
    let listen = format!("127.0.0.1:{tcp}");
    let side = |dev: &str, rails: [&str; 2], role: &str, control: u16| -> Vec<String> {
        let mut a: Vec<String> = ["--device", dev, "--rail", rails[0], "--rail", rails[1]]
            .map(String::from)
            .to_vec();
        a.extend([role.to_owned(), listen.clone()]);
        a.extend(
            [
                "--json",
                "--until-stdin-eof",
                "--interval-ms",
                "2",
                "--mode",
                "software",
            ]
            .map(String::from),
        );
        a.extend(["--control".to_owned(), format!("127.0.0.1:{control}")]);
        if let Some(k) = key {
            a.extend(["--peer-key".to_owned(), k.to_owned()]);
        }
        a
    };
    let server = side(
        "rxe1",
        ["10.0.10.2", "10.0.20.2"],
        "--listen",
        SERVER_CONTROL,
    );
    let client = side(
        "rxe0",
        ["10.0.10.1", "10.0.20.1"],
        "--connect",
        CLIENT_CONTROL,
    );
    let server: Vec<&str> = server.iter().map(String::as_str).collect();
    let client: Vec<&str> = client.iter().map(String::as_str).collect();
    let mut s = Pingpong::start(apm, "server", &server);
    let mut c = Pingpong::start(apm, "client", &client);
    s.wait_for("protected at", Duration::from_secs(60));
    c.wait_for("protected at", Duration::from_secs(60));
    (c, s)
}

fn failovers(report: &serde_json::Value) -> u64 {
    report["failovers"].as_u64().unwrap_or(0)
}

#[test]
#[ignore = "needs RDMA devices: run `cargo xtask hwtest` (or `--vm`)"]
fn forged_peer_messages_move_no_qp_of_a_keyed_deployment() {
    let (apm, v) = match prerequisites() {
        Ok(p) => p,
        Err(why) => return println!("SKIPPED forged_peer_messages: {why}"),
    };
    setup_rails();
    wait_for_rail_gids(&v);

    // Without a key: the forgery is a message from the peer.
    // (`wait_for` fails the test if the server does not move within 10 s.)
    let (mut c, mut s) = start(&apm, None, 18720);
    std::thread::sleep(Duration::from_millis(500));
    spoof(CLIENT_CONTROL, SERVER_CONTROL, &forged_migrate());
    let moved = s.0.wait_for("FAILOVER", Duration::from_secs(10)).1;
    println!("no key: the forged Migrate moved the server's QP: {moved}");
    // The two ends now disagree on the path: that run is over.
    for p in [&mut c, &mut s] {
        let _ = p.0.child.kill();
        let _ = p.0.child.wait();
    }

    // With a key on both sides: every forgery is dropped and counted, nothing moves.
    key_file("/tmp/forged-peer.key", &"k3y".repeat(16));
    key_file("/tmp/forged-other.key", &"0th3r".repeat(10));
    let (c, s) = start(&apm, Some("/tmp/forged-peer.key"), 18721);
    std::thread::sleep(Duration::from_millis(500));
    let other = cm_lap::auth::Authenticator::new(
        cm_lap::auth::Mode::Require(
            cm_lap::auth::Key::from_file(std::path::Path::new("/tmp/forged-other.key"))
                .expect("the other key"),
        ),
        7,
    );
    let mad = forged_migrate();
    let now = cm_lap::auth::wall_clock_ns();
    let sealed_elsewhere = other.seal(&mad, now);
    let forgeries: Vec<(&str, Vec<u8>)> = vec![
        ("no MAC (the unauthenticated version)", mad.to_vec()),
        ("sealed under another key", sealed_elsewhere.clone()),
        ("truncated", sealed_elsewhere[..100].to_vec()),
        ("oversized", vec![0xA5; 1400]),
    ];
    const ROUNDS: usize = 5;
    for _ in 0..ROUNDS {
        for (_, f) in &forgeries {
            spoof(CLIENT_CONTROL, SERVER_CONTROL, f);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (cr2, sr2) = (
        c.finish(Duration::from_secs(60)),
        s.finish(Duration::from_secs(60)),
    );
    let dropped = sr2["peer_datagrams_dropped"].as_u64().unwrap_or(0);
    println!(
        "with a key: {} forgeries ({}) x {ROUNDS}: server dropped {dropped}, failovers {}, \
         lost {}/{} duplicated {}/{}",
        forgeries.len(),
        forgeries
            .iter()
            .map(|(w, _)| *w)
            .collect::<Vec<_>>()
            .join(", "),
        failovers(&sr2),
        sr2["lost"],
        cr2["lost"],
        sr2["duplicated"],
        cr2["duplicated"],
    );
    assert_eq!(
        failovers(&sr2),
        0,
        "a forged message moved the server: {sr2}"
    );
    assert_eq!(
        failovers(&cr2),
        0,
        "a forged message moved the client: {cr2}"
    );
    assert!(
        dropped >= (forgeries.len() * ROUNDS) as u64,
        "every forgery is counted as dropped: {sr2}"
    );
    for r in [&sr2, &cr2] {
        assert_eq!(r["lost"], 0, "nothing lost: {r}");
        assert_eq!(r["duplicated"], 0, "nothing duplicated: {r}");
    }
}
