//! HTTP/1 requests and responses in a form in which two paths' can be compared.

/// A response as the client got it (or the fast path would send it), in comparable form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Got {
    pub http11: bool,
    pub status: u16,
    pub reason: Vec<u8>,
    /// Lowercase names, sorted by name, values in their order within a name; `date` apart.
    pub fields: Vec<(String, Vec<u8>)>,
    pub date: bool,
    /// `None` when the body was cut short.
    pub body: Option<Vec<u8>>,
}

/// Reads the response the client got (written by hyper's server or `h1::write_response_head`
/// followed by a body framed as its head says).
pub fn read_response(bytes: &[u8], head_request: bool) -> Got {
    let mut storage = [httparse::EMPTY_HEADER; 128];
    let mut res = httparse::Response::new(&mut storage);
    let Ok(httparse::Status::Complete(len)) = res.parse(bytes) else {
        // Nothing readable (the connection closed or reset first): status 0.
        return Got {
            http11: false,
            status: 0,
            reason: bytes.to_vec(),
            fields: Vec::new(),
            date: false,
            body: None,
        };
    };
    let mut fields: Vec<(String, Vec<u8>)> = res
        .headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let date = fields.iter().any(|f| f.0 == "date");
    fields.retain(|f| f.0 != "date");
    let status = res.code.unwrap();
    let value = |name: &str| fields.iter().find(|f| f.0 == name).map(|f| f.1.clone());
    let rest = &bytes[len..];
    let body = if head_request || matches!(status, 204 | 304) {
        Some(Vec::new())
    } else if value("transfer-encoding").is_some() {
        dechunk(rest)
    } else if let Some(n) = value("content-length") {
        // A list of equal lengths is passed on as it came ("5, 5").
        let n = std::str::from_utf8(&n).unwrap().split(',').next().unwrap();
        let n: usize = n.trim().parse().unwrap();
        rest.get(..n).map(<[u8]>::to_vec)
    } else {
        Some(rest.to_vec())
    };
    Got {
        http11: res.version == Some(1),
        status,
        reason: res.reason.unwrap_or("").as_bytes().to_vec(),
        fields,
        date,
        body,
    }
}

/// Decodes hyper's own chunked output (independent of `h1::Chunked` on purpose); `None` when
/// it stops short. Trailer fields, which the proxy does not forward, are not expected.
pub fn dechunk(bytes: &[u8]) -> Option<Vec<u8>> {
    let (mut body, mut at) = (Vec::new(), 0);
    loop {
        let end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
        let size = usize::from_str_radix(std::str::from_utf8(&bytes[at..end]).ok()?, 16).ok()?;
        at = end + 2;
        if size == 0 {
            return (bytes.get(at..at + 2) == Some(b"\r\n")).then_some(body);
        }
        body.extend_from_slice(bytes.get(at..at + size)?);
        at += size + 2;
    }
}

/// A request as an upstream saw it (or the fast path would send it), in comparable form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub target: String,
    /// Lowercase names, sorted by name, values in their order within a name.
    pub fields: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// Fails, listing them, when any of `of` runs is in `failures`.
pub fn assert_none_differ(failures: &[String], of: usize) {
    assert!(
        failures.is_empty(),
        "{} of {of} runs differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
