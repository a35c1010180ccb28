//! What a peer's bytes can break, and the codes HTTP/2 says so with.

/// An HTTP/2 error code (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reason(pub u32);

impl Reason {
    pub const NO_ERROR: Self = Self(0x0);
    pub const PROTOCOL_ERROR: Self = Self(0x1);
    pub const INTERNAL_ERROR: Self = Self(0x2);
    pub const FLOW_CONTROL_ERROR: Self = Self(0x3);
    pub const STREAM_CLOSED: Self = Self(0x5);
    pub const FRAME_SIZE_ERROR: Self = Self(0x6);
    pub const REFUSED_STREAM: Self = Self(0x7);
    pub const CANCEL: Self = Self(0x8);
    pub const COMPRESSION_ERROR: Self = Self(0x9);
    pub const ENHANCE_YOUR_CALM: Self = Self(0xb);
}

/// What a peer's bytes broke: the connection (GOAWAY, then close) or one stream (RST_STREAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The connection ends with this code.
    Connection(Reason),
    /// The stream is reset with this code.
    Stream(u32, Reason),
}
