//! Probe verdicts: a path held for flapping is up but not usable until its hold ends,
//! and a failure during the hold makes it dead again.

use super::harness::{path, port_info};
use crate::io::Input;
use crate::policy::Policy;
use crate::probe::{FailureKind, PathEnds};
use crate::types::Time;
use crate::Engine;
use std::time::Duration;

fn engine() -> Engine {
    let mut e = Engine::new(Policy::default()).expect("default policy");
    for port in [1, 2] {
        e.handle_input(Time::ZERO, Input::PortInfo(port_info('a', port)));
    }
    e
}

#[test]
fn a_held_path_is_up_but_unused_until_its_hold_ends() {
    let mut e = engine();
    let p = path('a', 1, 1);
    let ends = PathEnds {
        local: p.sgid,
        remote: p.dgid,
    };
    let t0 = Time::from_millis(100);
    let kind = FailureKind::Fabric;
    e.handle_input(t0, Input::PathDown { ends, kind });
    assert!(!e.path_up(&p) && !e.path_usable(&p));
    let until = t0.plus(Duration::from_secs(6));
    let t1 = t0.plus(Duration::from_millis(50));
    e.handle_input(t1, Input::PathHeld { ends, until });
    assert!(
        e.path_up(&p),
        "a connection with a dead primary may still move onto it"
    );
    assert!(!e.path_usable(&p), "nothing is armed onto it while held");
    assert_eq!(e.poll_timeout(), Some(until));
    e.handle_timeout(until);
    assert!(e.path_usable(&p));
    // Held again, then down during the hold: dead, and the hold's end changes nothing.
    let until = until.plus(Duration::from_secs(6));
    e.handle_input(until, Input::PathDown { ends, kind });
    let t2 = until.plus(Duration::from_millis(10));
    e.handle_input(
        t2,
        Input::PathHeld {
            ends,
            until: t2.plus(Duration::from_secs(8)),
        },
    );
    e.handle_input(
        t2.plus(Duration::from_secs(1)),
        Input::PathDown { ends, kind },
    );
    e.handle_timeout(t2.plus(Duration::from_secs(9)));
    assert!(!e.path_up(&p));
    // A plain Up ends everything.
    e.handle_input(t2.plus(Duration::from_secs(10)), Input::PathUp { ends });
    assert!(e.path_usable(&p));
}
