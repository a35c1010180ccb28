//! A route's `compression`: which encodings it offers, and which responses it compresses.

/// `compression = true` (the defaults) or `compression = { encodings, min_size, types, level }`:
/// responses are compressed with the best encoding the client accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compression {
    /// The encodings offered, most preferred first (the client's q-values decide first;
    /// between equals this order does). Default: zstd, br, gzip.
    pub encodings: Vec<Encoding>,
    /// A response whose length is known and smaller is sent as it is (a chunked one of
    /// unknown length is compressed). Default: 1 KiB.
    pub min_size: u64,
    /// The content types compressed: `type/subtype` or `type/*`, lowercase, without
    /// parameters. Default: [`DEFAULT_TYPES`].
    pub types: Vec<String>,
    /// Each encoding's level.
    pub levels: Levels,
}

/// Text formats that compress well (Caddy's `encode` defaults, NGINX's usual `gzip_types`).
pub const DEFAULT_TYPES: &[&str] = &[
    "text/*",
    "application/json",
    "application/javascript",
    "application/xml",
    "application/xhtml+xml",
    "application/atom+xml",
    "application/rss+xml",
    "application/ld+json",
    "application/manifest+json",
    "application/wasm",
    "image/svg+xml",
];

/// The smallest response compressed by default: below it the saving rarely pays for the work.
pub const DEFAULT_MIN_SIZE: u64 = 1024;

impl Default for Compression {
    fn default() -> Self {
        Self {
            encodings: vec![Encoding::Zstd, Encoding::Brotli, Encoding::Gzip],
            min_size: DEFAULT_MIN_SIZE,
            types: DEFAULT_TYPES.iter().map(|t| (*t).to_owned()).collect(),
            levels: Levels::default(),
        }
    }
}

/// A content coding Sluice can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// `zstd` (RFC 8878).
    Zstd,
    /// `br`, Brotli (RFC 7932).
    Brotli,
    /// `gzip` (RFC 1952).
    Gzip,
}

impl Encoding {
    /// The token that names it in `Accept-Encoding` and `Content-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Zstd => "zstd",
            Self::Brotli => "br",
            Self::Gzip => "gzip",
        }
    }
}

/// Compression levels: the default favours CPU over size, as proxies compressing on the fly do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    /// 1 (fastest) to 9. Default 1, NGINX's `gzip_comp_level`.
    pub gzip: u32,
    /// 0 to 11. Default 4, a common choice for dynamic content (11 is for static files).
    pub br: u32,
    /// 1 to 19. Default 3, zstd's own default.
    pub zstd: i32,
}

impl Default for Levels {
    fn default() -> Self {
        Self {
            gzip: 1,
            br: 4,
            zstd: 3,
        }
    }
}
