//! The own HTTP/2 transport's frame parser (`sluice_h2::frame`) over any bytes: it never
//! panics, and every frame it accepts that a server also writes (SETTINGS, PING, WINDOW_UPDATE,
//! RST_STREAM, GOAWAY, DATA, HEADERS) is written back by `frame::write_*` as bytes it parses
//! to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_h2::frame::{self, flag, Frame, Head, HEAD_LEN};

/// What `frame` is when a server writes it, parsed back.
fn rewritten(frame: &Frame<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match frame {
        Frame::Settings { ack, params } => frame::write_settings(&mut out, *ack, params),
        Frame::Ping { ack: true, data } => frame::write_ping_ack(&mut out, *data),
        Frame::WindowUpdate { stream, increment } => {
            frame::write_window_update(&mut out, *stream, *increment)
        }
        Frame::Reset { stream, reason } => frame::write_reset(&mut out, *stream, *reason),
        Frame::GoAway { last, reason } => frame::write_go_away(&mut out, *last, *reason),
        Frame::Data { stream, end, data, .. } => frame::write_data(&mut out, *stream, data, *end),
        Frame::Headers { stream, end_stream, end_headers: true, priority: None, fragment } => {
            frame::write_headers(&mut out, *stream, fragment, *end_stream, frame::DEFAULT_MAX_FRAME)
        }
        _ => return None,
    }
    Some(out)
}

fuzz_target!(|bytes: &[u8]| {
    let mut at = 0;
    while let Some(head) = Head::parse(&bytes[at..]) {
        let end = at + HEAD_LEN + head.len as usize;
        let Some(payload) = bytes.get(at + HEAD_LEN..end) else {
            break;
        };
        at = end;
        let Ok(parsed) = frame::parse(head, payload) else {
            continue;
        };
        if let Frame::Data { data, flow, .. } = &parsed {
            assert!(data.len() <= *flow as usize, "data longer than the frame");
        }
        let Some(out) = rewritten(&parsed) else {
            continue;
        };
        let again = Head::parse(&out).expect("a written frame has a head");
        if head.kind == frame::kind::HEADERS && out.len() > HEAD_LEN + again.len as usize {
            continue; // split into CONTINUATION: not one frame
        }
        let reparsed = frame::parse(again, &out[HEAD_LEN..]).expect("a written frame parses");
        match (&parsed, &reparsed) {
            (Frame::Data { stream, end, data, .. }, Frame::Data { stream: s, end: e, data: d, .. }) => {
                assert_eq!((stream, end, data), (s, e, d));
            }
            _ => assert_eq!(parsed, reparsed),
        }
        let _ = flag::ACK;
    }
});
