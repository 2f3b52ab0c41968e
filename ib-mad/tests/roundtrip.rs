//! Property tests: every message kind survives encode/decode unchanged, and decoding
//! arbitrary bytes never panics (it returns a value or a typed error).

use ib_mad::cm::*;
use ib_mad::rmpp::*;
use ib_mad::sa::*;
use ib_mad::smp::*;
use ib_mad::types::*;
use ib_mad::vendor::*;
use ib_mad::*;
use proptest::prelude::*;

macro_rules! bounded {
    ($t:ty) => {
        (0..=<$t>::MAX.get()).prop_map(|v| <$t>::new(v).unwrap())
    };
}

fn gid() -> impl Strategy<Value = Gid> {
    any::<[u8; 16]>().prop_map(Gid)
}

fn lid() -> impl Strategy<Value = Lid> {
    any::<u16>().prop_map(Lid)
}

fn bytes<const N: usize>() -> impl Strategy<Value = [u8; N]> {
    prop::collection::vec(any::<u8>(), N).prop_map(|v| {
        let mut a = [0u8; N];
        a.copy_from_slice(&v);
        a
    })
}

fn header(class: MgmtClass, version: u8) -> impl Strategy<Value = MadHeader> {
    (
        any::<u8>(),
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(move |(method, status, cs, tid, attr, modifier)| MadHeader {
            mgmt_class: class,
            class_version: version,
            method: Method(method),
            status,
            class_specific: cs,
            transaction_id: tid,
            attribute_id: AttributeId(attr),
            attribute_modifier: modifier,
        })
}

fn inform_info() -> impl Strategy<Value = InformInfo> {
    (
        gid(),
        lid(),
        lid(),
        any::<bool>(),
        any::<bool>(),
        any::<u16>(),
        any::<u16>(),
        bounded!(Qpn),
        bounded!(Timeout),
        bounded!(U24),
    )
        .prop_map(
            |(g, b, e, generic, sub, ty, trap, qpn, rt, pt)| InformInfo {
                gid: g,
                lid_range_begin: b,
                lid_range_end: e,
                is_generic: generic,
                subscribe: sub,
                inform_type: ty,
                trap_number: trap,
                qpn,
                resp_time_value: rt,
                producer_type: pt,
            },
        )
}

fn notice() -> impl Strategy<Value = Notice> {
    let details = prop_oneof![
        gid().prop_map(NoticeDetails::GidInService),
        gid().prop_map(NoticeDetails::GidOutOfService),
        lid().prop_map(NoticeDetails::LinkStateChange),
        (
            any::<u16>().prop_filter("typed traps", |t| ![64, 65, 128].contains(t)),
            bytes::<54>()
        )
            .prop_map(|(trap_number, data)| NoticeDetails::Generic { trap_number, data }),
        (any::<u16>(), bytes::<54>())
            .prop_map(|(device_id, data)| NoticeDetails::Vendor { device_id, data }),
    ];
    (
        bounded!(U7),
        bounded!(U24),
        lid(),
        any::<bool>(),
        bounded!(U15),
        details,
        gid(),
    )
        .prop_map(|(ty, pt, issuer, toggle, count, details, ig)| Notice {
            notice_type: ty,
            producer_type: pt,
            issuer_lid: issuer,
            toggle,
            count,
            details,
            issuer_gid: ig,
        })
}

fn path_record() -> impl Strategy<Value = PathRecord> {
    (
        (any::<u64>(), gid(), gid(), lid(), lid(), any::<bool>()),
        (
            bounded!(FlowLabel),
            any::<u8>(),
            any::<u8>(),
            any::<bool>(),
            bounded!(U7),
        ),
        (
            any::<u16>(),
            bounded!(U12),
            bounded!(Sl),
            bounded!(U2),
            bounded!(U6),
        ),
        (
            bounded!(U2),
            bounded!(U6),
            bounded!(U2),
            bounded!(U6),
            any::<u8>(),
        ),
    )
        .prop_map(
            |(
                (sid, dgid, sgid, dlid, slid, raw),
                (fl, hl, tc, rev, np),
                (pk, qos, sl, ms, mtu),
                (rs, rate, ps, plt, pref),
            )| {
                PathRecord {
                    service_id: sid,
                    dgid,
                    sgid,
                    dlid,
                    slid,
                    raw_traffic: raw,
                    flow_label: fl,
                    hop_limit: hl,
                    traffic_class: tc,
                    reversible: rev,
                    numb_path: np,
                    pkey: pk,
                    qos_class: qos,
                    sl,
                    mtu_selector: ms,
                    mtu,
                    rate_selector: rs,
                    rate,
                    packet_life_time_selector: ps,
                    packet_life_time: plt,
                    preference: pref,
                }
            },
        )
}

fn class_address(hop_limit: bool) -> impl Strategy<Value = ClassAddress> {
    (
        gid(),
        any::<u8>(),
        bounded!(Sl),
        bounded!(FlowLabel),
        lid(),
        any::<u16>(),
        any::<u8>(),
        bounded!(Qpn),
        any::<u32>(),
    )
        .prop_map(move |(g, tc, sl, fl, l, pk, hl, qp, qk)| ClassAddress {
            gid: g,
            traffic_class: tc,
            sl,
            flow_label: fl,
            lid: l,
            pkey: pk,
            hop_limit: if hop_limit { hl } else { 0 },
            qp,
            qkey: qk,
        })
}

fn class_port_info() -> impl Strategy<Value = ClassPortInfo> {
    (
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        bounded!(U27),
        bounded!(Timeout),
        class_address(false),
        class_address(true),
    )
        .prop_map(|(bv, cv, cm, cm2, rt, redirect, trap)| ClassPortInfo {
            base_version: bv,
            class_version: cv,
            capability_mask: cm,
            capability_mask2: cm2,
            resp_time_value: rt,
            redirect,
            trap,
        })
}

fn lap() -> impl Strategy<Value = Lap> {
    (
        (
            any::<u32>(),
            any::<u32>(),
            bounded!(Qpn),
            bounded!(Timeout),
            lid(),
            lid(),
        ),
        (gid(), gid(), bounded!(FlowLabel), any::<u8>(), any::<u8>()),
        (
            bounded!(U6),
            bounded!(Sl),
            any::<bool>(),
            bounded!(Timeout),
            bytes::<168>(),
        ),
    )
        .prop_map(
            |((l, r, qpn, rt, ll, rl), (lg, rg, fl, tc, hl), (pr, sl, sn, at, pd))| Lap {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn: qpn,
                remote_cm_response_timeout: rt,
                alt_local_lid: ll,
                alt_remote_lid: rl,
                alt_local_gid: lg,
                alt_remote_gid: rg,
                alt_flow_label: fl,
                alt_traffic_class: tc,
                alt_hop_limit: hl,
                alt_packet_rate: pr,
                alt_sl: sl,
                alt_subnet_local: sn,
                alt_local_ack_timeout: at,
                private_data: pd,
            },
        )
}

fn apr() -> impl Strategy<Value = Apr> {
    (
        any::<u32>(),
        any::<u32>(),
        0..14u8,
        prop::collection::vec(any::<u8>(), 0..=72),
        bytes::<148>(),
    )
        .prop_map(|(l, r, st, info, pd)| Apr {
            local_comm_id: l,
            remote_comm_id: r,
            ap_status: ApStatus::from_code(st).unwrap(),
            additional_info: AdditionalInfo::new(&info).unwrap(),
            private_data: pd,
        })
}

fn mra() -> impl Strategy<Value = Mra> {
    (
        any::<u32>(),
        any::<u32>(),
        prop_oneof![
            Just(MessageMraed::Req),
            Just(MessageMraed::Rep),
            Just(MessageMraed::Lap)
        ],
        bounded!(Timeout),
        bytes::<222>(),
    )
        .prop_map(|(l, r, m, t, pd)| Mra {
            local_comm_id: l,
            remote_comm_id: r,
            message_mraed: m,
            service_timeout: t,
            private_data: pd,
        })
}

fn req_path() -> impl Strategy<Value = ReqPath> {
    (
        (
            lid(),
            lid(),
            gid(),
            gid(),
            bounded!(FlowLabel),
            bounded!(U6),
        ),
        (
            any::<u8>(),
            any::<u8>(),
            bounded!(Sl),
            any::<bool>(),
            bounded!(Timeout),
        ),
    )
        .prop_map(|((ll, rl, lg, rg, fl, pr), (tc, hl, sl, sn, at))| ReqPath {
            local_lid: ll,
            remote_lid: rl,
            local_gid: lg,
            remote_gid: rg,
            flow_label: fl,
            packet_rate: pr,
            traffic_class: tc,
            hop_limit: hl,
            sl,
            subnet_local: sn,
            local_ack_timeout: at,
        })
}

fn req() -> impl Strategy<Value = Req> {
    (
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            bounded!(Qpn),
            any::<u8>(),
        ),
        (
            bounded!(U24),
            any::<u8>(),
            bounded!(U24),
            bounded!(Timeout),
            bounded!(U2),
            any::<bool>(),
        ),
        (
            bounded!(U24),
            bounded!(Timeout),
            bounded!(U3),
            any::<u16>(),
            bounded!(U4),
            any::<bool>(),
        ),
        (
            bounded!(U3),
            bounded!(U4),
            any::<bool>(),
            bounded!(U3),
            req_path(),
            req_path(),
        ),
        (any::<bool>(), bytes::<92>()),
    )
        .prop_map(
            |(
                (lc, sid, guid, qk, qpn, rr),
                (le, id, re, rt, tst, e2e),
                (psn, lt, rc, pk, mtu, rdc),
                (rnr, mcr, srq, ett, p, a),
                (sap, pd),
            )| Req {
                local_comm_id: lc,
                service_id: sid,
                local_ca_guid: guid,
                local_q_key: qk,
                local_qpn: qpn,
                responder_resources: rr,
                local_eecn: le,
                initiator_depth: id,
                remote_eecn: re,
                remote_cm_response_timeout: rt,
                transport_service_type: tst,
                end_to_end_flow_control: e2e,
                starting_psn: psn,
                local_cm_response_timeout: lt,
                retry_count: rc,
                partition_key: pk,
                path_packet_payload_mtu: mtu,
                rdc_exists: rdc,
                rnr_retry_count: rnr,
                max_cm_retries: mcr,
                srq,
                extended_transport_type: ett,
                primary: p,
                alternate: a,
                sap_supported: sap,
                private_data: pd,
            },
        )
}

fn rmpp_header() -> impl Strategy<Value = RmppHeader> {
    (
        any::<u8>(),
        prop_oneof![
            Just(RmppType::None),
            Just(RmppType::Data),
            Just(RmppType::Ack),
            Just(RmppType::Stop),
            Just(RmppType::Abort)
        ],
        bounded!(Timeout),
        any::<(bool, bool, bool)>(),
        any::<u8>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(v, t, rt, (a, f, l), st, d1, d2)| RmppHeader {
            version: v,
            rmpp_type: t,
            resp_time: rt,
            flags: RmppFlags {
                active: a,
                first: f,
                last: l,
            },
            status: st,
            data1: d1,
            data2: d2,
        })
}

fn sa_mad() -> impl Strategy<Value = SaMad> {
    let typed = prop_oneof![
        inform_info().prop_map(SaPayload::InformInfo),
        notice().prop_map(SaPayload::Notice),
        path_record().prop_map(SaPayload::PathRecord),
        class_port_info().prop_map(SaPayload::ClassPortInfo),
    ];
    let sa = (any::<u64>(), any::<u16>(), any::<u64>()).prop_map(|(k, o, m)| SaHeader {
        sm_key: k,
        attribute_offset: o,
        component_mask: m,
    });
    prop_oneof![
        // A typed attribute: no RMPP, status 0, not a table response.
        (header(MgmtClass::SUBN_ADM, 2), sa.clone(), typed).prop_map(|(mut h, sa, p)| {
            h.status = 0;
            if matches!(h.method, Method::GET_TABLE_RESP | Method::GET_MULTI_RESP) {
                h.method = Method::GET_RESP;
            }
            h.attribute_id = p.attribute_id().unwrap();
            SaMad {
                header: h,
                rmpp: RmppHeader::NONE,
                sa,
                payload: p,
            }
        }),
        // Raw data under an RMPP header.
        (
            header(MgmtClass::SUBN_ADM, 2),
            rmpp_header(),
            sa,
            bytes::<200>()
        )
            .prop_map(|(h, mut r, sa, raw)| {
                r.flags.active = true;
                SaMad {
                    header: h,
                    rmpp: r,
                    sa,
                    payload: SaPayload::Raw(Box::new(raw)),
                }
            }),
    ]
}

fn cm_mad() -> impl Strategy<Value = CmMad> {
    // A REQ travels as CmBody::Other (its own Attribute), under attribute 0x0010.
    let req_body = req().prop_map(|r| {
        let mut raw = [0u8; 232];
        r.encode(&mut raw);
        CmBody::Other(Box::new(raw))
    });
    let body = prop_oneof![
        lap().prop_map(CmBody::Lap),
        apr().prop_map(CmBody::Apr),
        mra().prop_map(CmBody::Mra),
        req_body,
    ];
    (header(MgmtClass::CM, 2), body).prop_map(|(mut h, b)| {
        h.attribute_id = b.attribute_id().unwrap_or(AttributeId::CM_REQ);
        CmMad { header: h, body: b }
    })
}

fn smp() -> impl Strategy<Value = Smp> {
    (
        any::<bool>(),
        header(MgmtClass::SUBN_DIRECTED_ROUTE, 1),
        any::<u64>(),
        lid(),
        lid(),
        bytes::<64>(),
        bytes::<64>(),
        bytes::<64>(),
    )
        .prop_map(|(dr, mut h, mk, sl, dl, data, ip, rp)| {
            if !dr {
                h.mgmt_class = MgmtClass::SUBN_LID_ROUTED;
            }
            Smp {
                header: h,
                m_key: mk,
                dr_slid: if dr { sl } else { Lid(0) },
                dr_dlid: if dr { dl } else { Lid(0) },
                data,
                initial_path: if dr { ip } else { [0; 64] },
                return_path: if dr { rp } else { [0; 64] },
            }
        })
}

fn sm_info() -> impl Strategy<Value = SmInfo> {
    (
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        bounded!(U4),
        prop_oneof![
            Just(SmState::NotActive),
            Just(SmState::Discovering),
            Just(SmState::Standby),
            Just(SmState::Master)
        ],
    )
        .prop_map(|(g, k, a, p, s)| SmInfo {
            guid: g,
            sm_key: k,
            act_count: a,
            priority: p,
            sm_state: s,
        })
}

fn vendor() -> impl Strategy<Value = VendorMad> {
    (
        0x30..=0x4Fu8,
        header(MgmtClass(0x30), 1),
        rmpp_header(),
        bounded!(U24),
        bytes::<216>(),
    )
        .prop_map(|(class, mut h, r, oui, data)| {
            h.mgmt_class = MgmtClass(class);
            VendorMad {
                header: h,
                rmpp: r,
                oui: Oui(oui),
                data: Box::new(data),
            }
        })
}

fn mad() -> impl Strategy<Value = Mad> {
    prop_oneof![
        sa_mad().prop_map(Mad::Sa),
        cm_mad().prop_map(Mad::Cm),
        smp().prop_map(Mad::Smp),
        vendor().prop_map(Mad::Vendor),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_mad_round_trips(m in mad()) {
        let wire = m.encode();
        prop_assert_eq!(Mad::decode(&wire), Ok(m));
    }

    #[test]
    fn field_view_matches_the_wire(m in mad()) {
        let wire = m.encode();
        for f in ib_mad::fields::describe(&m) {
            prop_assert_eq!(
                ib_mad::fields::read_field(&wire, &f),
                f.value.clone(),
                "{} at byte {} bit {}", f.name, f.offset, f.bit
            );
            // Writing the value back changes nothing.
            let mut copy = wire;
            ib_mad::fields::write_field(&mut copy, &f, &f.value).unwrap();
            prop_assert_eq!(copy, wire);
        }
    }

    #[test]
    fn attributes_round_trip(
        i in inform_info(), n in notice(), p in path_record(), c in class_port_info(),
        s in sm_info(), r in req(),
    ) {
        fn rt<A: Attribute + PartialEq + std::fmt::Debug>(a: A) -> Result<(), TestCaseError> {
            let mut buf = vec![0u8; A::SIZE];
            a.encode(&mut buf);
            prop_assert_eq!(A::decode(&buf), Ok(a));
            Ok(())
        }
        rt(i)?;
        rt(n)?;
        rt(p)?;
        rt(c)?;
        rt(s)?;
        rt(r)?;
    }

    #[test]
    fn cm_messages_fit_a_vendor_carrier(l in lap(), a in apr(), m in mra()) {
        // In 216 bytes the private data is cut; everything else survives.
        let mut room = [0u8; VENDOR_DATA_SIZE];
        l.encode(&mut room);
        let back = Lap::decode(&room).unwrap();
        prop_assert_eq!(&back.private_data[..152], &l.private_data[..152]);
        prop_assert_eq!(Lap { private_data: l.private_data, ..back }, l);
        a.encode(&mut room);
        prop_assert_eq!(Apr::decode(&room).unwrap().ap_status, a.ap_status);
        m.encode(&mut room);
        prop_assert_eq!(Mra::decode(&room).unwrap().service_timeout, m.service_timeout);
    }

    #[test]
    fn rmpp_header_round_trips(h in rmpp_header()) {
        let mut mad = [0u8; MAD_SIZE];
        h.encode(&mut mad);
        prop_assert_eq!(RmppHeader::decode(&mad), Ok(h));
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = Mad::decode(&data);
        let _ = SaMad::decode(&data);
        let _ = CmMad::decode(&data);
        let _ = Smp::decode(&data);
        let _ = VendorMad::decode(&data);
        let _ = MadHeader::decode(&data);
        let _ = RmppHeader::decode(&data);
        let _ = SaHeader::decode(&data);
        let _ = InformInfo::decode(&data);
        let _ = Notice::decode(&data);
        let _ = PathRecord::decode(&data);
        let _ = ClassPortInfo::decode(&data);
        let _ = Lap::decode(&data);
        let _ = Apr::decode(&data);
        let _ = Mra::decode(&data);
        let _ = SmInfo::decode(&data);
        let _ = Req::decode(&data);
        let _ = table_records::<PathRecord>(&data, 8).count();
    }

    #[test]
    fn arbitrary_full_mads_never_panic(data in bytes::<256>(), class in any::<u8>()) {
        // Force plausible headers so the class decoders get past the first checks.
        let mut m = data;
        m[0] = 1;
        m[1] = class;
        m[2] = if class == 1 || class == 0x81 { 1 } else { 2 };
        if let Ok(mad) = Mad::decode(&m) {
            prop_assert_eq!(Mad::decode(&mad.encode()), Ok(mad));
        }
    }

    #[test]
    fn rmpp_reassembles_any_payload(
        len in 0usize..6000,
        window in 1u32..8,
        drops in prop::collection::vec(1u32..40, 0..5),
    ) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let mut t = SaMad::new(Method::GET_TABLE_RESP, 5, SaPayload::Raw(Box::new([0; 200])));
        t.header.attribute_id = PathRecord::ID;
        let mut tx = RmppSender::new(&t.encode(), data.clone(), Timeout::ZERO).unwrap();
        let mut rx = RmppReceiver::with_limits(window, 1 << 16);
        let mut dropped = Vec::new();
        let mut got = None;
        for _ in 0..10_000 {
            let mut sent = false;
            while let Some(seg) = tx.poll_transmit() {
                sent = true;
                let n = RmppHeader::decode(&seg).unwrap().data1;
                if drops.contains(&n) && !dropped.contains(&n) {
                    dropped.push(n);
                    continue;
                }
                match rx.handle(&seg).unwrap() {
                    RecvEvent::Continue { ack: Some(ack) } => tx.handle_ack(&ack).unwrap(),
                    RecvEvent::Continue { ack: None } => {}
                    RecvEvent::Complete { ack, message } => {
                        tx.handle_ack(&ack.unwrap()).unwrap();
                        got = Some(message.into_data());
                    }
                }
            }
            if tx.is_complete() {
                break;
            }
            if !sent {
                tx.retransmit();
            }
        }
        prop_assert!(tx.is_complete());
        prop_assert_eq!(got, Some(data));
    }
}
