//! Data-driven scenarios: each row is a script of events on the two-node bench and the
//! outcome expected afterwards, written as text so a row reads like the behaviour it
//! pins down. One `check` runs them all.
//!
//! Script words (space separated, applied in order):
//! - `protect` / `protect-sw`: protect connection 1 on both sides (hardware / software)
//! - `a.down1`, `b.up2`: port event on node a/b, port 1/2
//! - `a.trap-b1-` / `a.trap-b1+`: node a gets trap 65 / 64 about b's port 1
//! - `a.pathmig`, `a.migerr`, `a.fatal`, `a.stall`: QP events for connection 1
//! - `a.fail-load`, `a.ok`: node a's provider refuses loads / works again
//! - `drop`, `deliver`: the wire drops everything / works again
//! - `wait:MS`: let MS milliseconds of virtual time pass

use super::harness::*;
use crate::io::*;
use crate::types::*;
use crate::Protection;

struct Row {
    name: &'static str,
    script: &'static str,
    /// Protection of connection 1 on a and b afterwards.
    expect: (Protection, Protection),
    /// a's primary afterwards as (local port, remote port).
    a_primary: (u8, u8),
    /// Command names a must have issued since the start (in order, as a subsequence).
    a_ops: &'static [&'static str],
}

const ROWS: &[Row] = &[
    Row {
        name: "1 protect arms a port-disjoint alternate",
        script: "protect wait:500",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["send_peer", "load_alternate", "set_rearm"],
    },
    Row {
        name: "2 local PORT_ERR: the peer is asked over the alternate, both move, and the \
               path they left (dead from a's view) is armed again",
        script: "protect wait:500 a.down1 wait:1000",
        expect: (Protection::Unprotected, Protection::Armed),
        a_primary: (2, 2),
        a_ops: &[
            "set_rearm",
            "send_peer",
            "force_migrate",
            "load_alternate",
            "set_rearm",
        ],
    },
    Row {
        name: "2 ... and protected again, with no LAP, when the port returns",
        script: "protect wait:500 a.down1 wait:1000 a.up1 wait:1000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (2, 2),
        a_ops: &["force_migrate", "load_alternate", "set_rearm"],
    },
    Row {
        name: "2 PORT_ERR on the alternate's port keeps it armed (a second retry budget): \
               nothing working ranks as high",
        script: "protect wait:500 a.down2 wait:1000",
        expect: (Protection::Unprotected, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["send_peer", "load_alternate", "set_rearm"],
    },
    Row {
        name: "3 trap 65 for each side's port 1: both ask, both move, the path left is \
               armed again though dead",
        script: "protect wait:500 a.trap-b1- b.trap-a1- wait:1000",
        expect: (Protection::Unprotected, Protection::Unprotected),
        a_primary: (2, 2),
        a_ops: &["force_migrate", "load_alternate", "set_rearm"],
    },
    Row {
        name: "3 trap 65 on the passive side alone: it asks, the active side follows",
        script: "protect wait:500 b.trap-a1- wait:1000",
        expect: (Protection::Armed, Protection::Unprotected),
        a_primary: (2, 2),
        a_ops: &["set_rearm", "force_migrate", "load_alternate", "set_rearm"],
    },
    Row {
        name: "4 hardware PATH_MIG swaps and arms the path left at once",
        script: "protect wait:500 a.pathmig b.pathmig wait:1000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (2, 2),
        a_ops: &["set_rearm", "load_alternate", "set_rearm"],
    },
    Row {
        name: "5 PORT_ACTIVE protects what was armed on a dead path",
        script: "a.down2 b.down2 protect wait:500 a.up2 b.up2 wait:1000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["send_peer", "load_alternate", "set_rearm"],
    },
    Row {
        name: "5 trap 64 protects what was armed on a dead path",
        script: "a.trap-b2- a.trap-b1- a.down2 protect wait:500 a.trap-b2+ a.up2 wait:1000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["send_peer", "load_alternate", "set_rearm"],
    },
    Row {
        name: "6 PATH_MIG_ERR marks the alternate bad and tries the next",
        script: "protect wait:500 a.migerr wait:1000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["set_rearm", "send_peer", "load_alternate", "set_rearm"],
    },
    Row {
        name: "9 an unanswered LAP leaves the connection unprotected, retried later",
        script: "drop protect wait:1600",
        expect: (Protection::Unprotected, Protection::Unprotected),
        a_primary: (1, 1),
        a_ops: &["send_peer", "send_peer", "send_peer", "send_peer"],
    },
    Row {
        name: "9 ... and armed once the peer answers",
        script: "drop protect wait:1600 deliver wait:5000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["load_alternate", "set_rearm"],
    },
    Row {
        name: "both rails down: unprotected, never a migration onto a dead port",
        script: "protect wait:500 a.down2 a.down1 wait:1000",
        expect: (Protection::Unprotected, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["set_rearm"],
    },
    Row {
        name: "QP fatal: lost",
        script: "protect wait:500 a.fatal",
        expect: (Protection::Lost, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["set_rearm"],
    },
    Row {
        name: "a load failure at the peer: APR rejected, next candidate, recovered later",
        script: "b.fail-load protect wait:300 b.ok wait:30000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (1, 1),
        a_ops: &["send_peer", "send_peer", "load_alternate", "set_rearm"],
    },
    Row {
        name: "software migration (RoCE) on a stalled primary: the peer is asked, both move",
        script: "protect-sw wait:500 a.stall wait:1000",
        expect: (Protection::Armed, Protection::Armed),
        a_primary: (2, 2),
        a_ops: &["send_peer", "software_migrate"],
    },
];

fn apply(p: &mut Pair, word: &str) {
    if let Some(ms) = word.strip_prefix("wait:") {
        p.run_for(ms.parse().expect("wait:MS"));
        return;
    }
    match word {
        "protect" => return p.protect(1),
        "protect-sw" => return p.protect_mode(1, MigrationMode::Software),
        "drop" => return p.drop = Box::new(|_, _| true),
        "deliver" => return p.drop = Box::new(|_, _| false),
        _ => {}
    }
    let (node, what) = word.split_once('.').expect("node.event");
    let node = node.chars().next().expect("a or b");
    let port_event = |port: char, event| Input::PortEvent {
        port: PortKey::new(DEV, port.to_digit(10).expect("port digit") as u8),
        event,
    };
    let qp = |event| Input::QpEvent {
        conn: ConnId(1),
        event,
    };
    let input = match what {
        "pathmig" => qp(QpEvent::PathMigrated),
        "migerr" => qp(QpEvent::PathMigrationError),
        "fatal" => qp(QpEvent::Fatal),
        "stall" => qp(QpEvent::PrimaryStalled),
        "fail-load" => return p.node(node).fail_ops.push("load_alternate"),
        "ok" => return p.node(node).fail_ops.clear(),
        w if w.starts_with("down") => port_event(w.chars().last().expect("port"), PortEvent::Down),
        w if w.starts_with("up") => port_event(w.chars().last().expect("port"), PortEvent::Active),
        w if w.starts_with("trap-") => {
            let spec: Vec<char> = w["trap-".len()..].chars().collect();
            let port = spec[1].to_digit(10).expect("port digit") as u8;
            Input::RemoteGid {
                gid: gid(spec[0], port),
                service: if spec[2] == '+' {
                    GidService::InService
                } else {
                    GidService::OutOfService
                },
            }
        }
        other => panic!("unknown script word {other:?}"),
    };
    p.input(node, input);
    p.run_for(0);
}

fn is_subsequence(want: &[&str], have: &[&str]) -> bool {
    let mut it = have.iter();
    want.iter().all(|w| it.any(|h| h == w))
}

/// What is wrong with `row`'s outcome, if anything.
fn check(row: &Row) -> Option<String> {
    let mut p = Pair::new();
    for word in row.script.split_whitespace() {
        apply(&mut p, word);
    }
    let got = (p.a.status(1).protection, p.b.status(1).protection);
    if got != row.expect {
        return Some(format!(
            "protection (a, b) {got:?}, expected {:?}",
            row.expect
        ));
    }
    let prim = p.a.status(1).primary;
    let want = (row.a_primary.0, gid('b', row.a_primary.1));
    if (prim.port.port, prim.dgid) != want {
        return Some(format!("a's primary {prim}, expected {want:?}"));
    }
    let ops: Vec<&str> =
        p.a.op_names()
            .into_iter()
            .filter(|o| *o != "subscribe")
            .collect();
    (!is_subsequence(row.a_ops, &ops)).then(|| format!("a's commands {ops:?} lack {:?}", row.a_ops))
}

#[test]
fn scenario_table() {
    let failed: Vec<String> = ROWS
        .iter()
        .filter_map(|row| check(row).map(|why| format!("{}: {why}", row.name)))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
