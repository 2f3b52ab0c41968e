//! The RMPP receiver fed any sequence of 256-byte MADs (a hostile or broken sender),
//! and the sender fed any ACKs: no panic, memory bounded by the configured limit.
#![no_main]

use ib_mad::rmpp::{RecvEvent, RmppHeader, RmppReceiver, RmppSender};
use ib_mad::types::Timeout;
use ib_mad::MAD_SIZE;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&window, rest)) = data.split_first() else {
        return;
    };
    let mut rx = RmppReceiver::with_limits(u32::from(window % 8), LIMIT);
    let mut first_ok: Option<[u8; MAD_SIZE]> = None;
    for chunk in rest.chunks(MAD_SIZE) {
        let _ = RmppHeader::decode(chunk);
        match rx.handle(chunk) {
            Ok(RecvEvent::Complete { message, .. }) => {
                assert!(message.data().len() <= LIMIT);
            }
            Ok(RecvEvent::Continue { .. }) | Err(_) => {}
        }
        if first_ok.is_none() && chunk.len() == MAD_SIZE {
            let mut m = [0u8; MAD_SIZE];
            m.copy_from_slice(chunk);
            first_ok = Some(m);
        }
    }
    // The same bytes as a sender's template and its ACKs.
    if let Some(template) = first_ok {
        if let Ok(mut tx) = RmppSender::new(&template, rest.to_vec(), Timeout::ZERO) {
            for chunk in rest.chunks(MAD_SIZE) {
                let _ = tx.poll_transmit();
                let _ = tx.handle_ack(chunk);
                if chunk.first() == Some(&0) {
                    tx.retransmit();
                }
            }
        }
    }
});
