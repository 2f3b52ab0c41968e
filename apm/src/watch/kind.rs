//! The kinds of events `apm watch` reports, their names (output, `--event`,
//! `APM_EVENT`) and how engine port events and probe verdicts map onto them. Names
//! only: no IO.

use apm_core::probe::PathVerdict;
use apm_core::{GidService, PortEvent};

/// The kinds of events `apm watch` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventKind {
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`.
    PortDown,
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange,
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange,
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
    /// SA trap 64.
    GidInService,
    /// SA trap 65.
    GidOutOfService,
    /// A liveness probe session went down (local port, peer port or the fabric).
    PathDown,
    /// A liveness probe session is up (the first time, or again).
    PathUp,
    /// A probe session is up again, its path held for flapping.
    PathHeld,
    /// An operator said an address is unreachable (`apm agent --rail-down`).
    RailDown,
}

pub(super) const KINDS: [EventKind; 14] = [
    EventKind::PortActive,
    EventKind::PortDown,
    EventKind::LidChange,
    EventKind::SmChange,
    EventKind::ClientReregister,
    EventKind::PkeyChange,
    EventKind::GidChange,
    EventKind::DeviceFatal,
    EventKind::GidInService,
    EventKind::GidOutOfService,
    EventKind::PathDown,
    EventKind::PathUp,
    EventKind::PathHeld,
    EventKind::RailDown,
];

impl EventKind {
    /// The name in output, `--event` and `APM_EVENT`.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::PortActive => "port_active",
            EventKind::PortDown => "port_down",
            EventKind::LidChange => "lid_change",
            EventKind::SmChange => "sm_change",
            EventKind::ClientReregister => "client_reregister",
            EventKind::PkeyChange => "pkey_change",
            EventKind::GidChange => "gid_change",
            EventKind::DeviceFatal => "device_fatal",
            EventKind::GidInService => "gid_in_service",
            EventKind::GidOutOfService => "gid_out_of_service",
            EventKind::PathDown => "path_down",
            EventKind::PathUp => "path_up",
            EventKind::PathHeld => "path_held",
            EventKind::RailDown => "rail_down",
        }
    }

    pub(super) fn parse(s: &str) -> Result<EventKind, String> {
        let want = s.trim().replace('-', "_").to_ascii_lowercase();
        KINDS.into_iter().find(|k| k.name() == want).ok_or_else(|| {
            let names: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
            format!("unknown event kind {s:?}; one of {}", names.join(", "))
        })
    }

    pub(super) fn of_gid_service(s: GidService) -> EventKind {
        match s {
            GidService::InService => EventKind::GidInService,
            GidService::OutOfService => EventKind::GidOutOfService,
        }
    }

    pub(super) fn of_verdict(v: PathVerdict) -> EventKind {
        match v {
            PathVerdict::Down { .. } => EventKind::PathDown,
            PathVerdict::Up => EventKind::PathUp,
            PathVerdict::Held { .. } => EventKind::PathHeld,
        }
    }

    pub(super) fn of_port_event(e: PortEvent) -> EventKind {
        match e {
            PortEvent::Active => EventKind::PortActive,
            PortEvent::Down => EventKind::PortDown,
            PortEvent::LidChange => EventKind::LidChange,
            PortEvent::SmChange => EventKind::SmChange,
            PortEvent::ClientReregister => EventKind::ClientReregister,
            PortEvent::PkeyChange => EventKind::PkeyChange,
            PortEvent::GidChange => EventKind::GidChange,
        }
    }
}
