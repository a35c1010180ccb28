//! The names a client certificate presents, for mTLS at the acceptor: its DNS subject
//! alternative names, or its subject's common name when it has none. The certificate comes
//! from the network (rustls has verified its chain, but its contents are the client's), so
//! this reader is bounded and never panics on any input.

use rustls_pki_types::CertificateDer;

/// The DER encoding of the `commonName` attribute type, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// The names of a DER certificate, lowercase: its DNS subject alternative names, or its
/// subject's common name when it has none; empty when it parses as neither.
pub fn cert_names(der: &CertificateDer<'_>) -> Vec<String> {
    // rustls has already verified the chain, so this parse is not expected to fail; if it
    // does, the certificate has no names and matches no grant.
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else {
        return Vec::new();
    };
    let dns: Vec<String> = cert
        .valid_dns_names()
        .map(str::to_ascii_lowercase)
        .collect();
    if !dns.is_empty() {
        return dns;
    }
    common_name(cert.subject())
        .map(|cn| vec![cn.to_ascii_lowercase()])
        .unwrap_or_default()
}

/// When a DER certificate expires (its validity's `notAfter`), in seconds since the Unix epoch;
/// `None` when it does not parse that far. Read for the operator (`/status`, a gauge), never to
/// decide trust (rustls does that).
pub fn not_after(der: &CertificateDer<'_>) -> Option<i64> {
    let (cert, _) = der_take(der.as_ref(), 0x30)?;
    let (mut tbs, _) = der_take(cert, 0x30)?;
    // [0] EXPLICIT version, when present.
    if tbs.first() == Some(&0xa0) {
        tbs = der_take(tbs, 0xa0)?.1;
    }
    let (_serial, rest) = der_take(tbs, 0x02)?;
    let (_signature, rest) = der_take(rest, 0x30)?;
    let (_issuer, rest) = der_take(rest, 0x30)?;
    let (validity, _) = der_take(rest, 0x30)?;
    let tag = *validity.first()?;
    let (_not_before, rest) = der_take(validity, tag)?;
    let tag = *rest.first()?;
    let (time, _) = der_take(rest, tag)?;
    der_time(tag, time)
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`) as
/// seconds since the Unix epoch.
fn der_time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| -> Option<i64> {
        s.iter().try_fold(0i64, |acc, &b| {
            b.is_ascii_digit().then(|| acc * 10 + i64::from(b - b'0'))
        })
    };
    let (year, rest) = match (tag, text.len()) {
        (0x17, 13) => {
            let yy = digits(&text[..2])?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &text[2..])
        }
        (0x18, 15) => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    if rest.last() != Some(&b'Z') {
        return None;
    }
    let [mo, d, h, mi, s] = [0, 2, 4, 6, 8].map(|i| digits(&rest[i..i + 2]));
    let (mo, d, h, mi, s) = (mo?, d?, h?, mi?, s?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(year, mo, d) * 86_400 + h * 3600 + mi * 60 + s)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The first `commonName` of a DER `Name` (its contents, as webpki's `subject()` returns
/// them): a sequence of SETs of { OID, value } SEQUENCEs. `None` if absent or not a string.
fn common_name(mut rdns: &[u8]) -> Option<String> {
    while !rdns.is_empty() {
        let (mut set, rest) = der_take(rdns, 0x31)?;
        rdns = rest;
        while !set.is_empty() {
            let (attribute, rest) = der_take(set, 0x30)?;
            set = rest;
            let (oid, value) = der_take(attribute, 0x06)?;
            if oid == OID_COMMON_NAME {
                return der_string(value);
            }
        }
    }
    None
}

/// A UTF8String, PrintableString or IA5String value.
fn der_string(input: &[u8]) -> Option<String> {
    let tag = *input.first()?;
    if !matches!(tag, 0x0c | 0x13 | 0x16) {
        return None;
    }
    let (value, _) = der_take(input, tag)?;
    std::str::from_utf8(value).ok().map(str::to_owned)
}

/// Splits one DER element with `tag` off `input`: (its contents, what follows it).
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&len0, rest) = rest.split_first()?;
    let (len, rest) = if len0 < 0x80 {
        (usize::from(len0), rest)
    } else {
        // Long form; a name longer than 16 MiB is not one we will read.
        let n = usize::from(len0 & 0x7f);
        if n == 0 || n > 3 || rest.len() < n {
            return None;
        }
        let (bytes, rest) = rest.split_at(n);
        let len = bytes
            .iter()
            .fold(0usize, |acc, &b| acc << 8 | usize::from(b));
        (len, rest)
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn cert(sans: &[&str], cn: Option<&str>) -> CertificateDer<'static> {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Sluice tests");
        if let Some(cn) = cn {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn names_are_dns_sans_else_the_common_name() {
        let both = cert(&["Billing-1.internal", "b1.internal"], Some("ignored"));
        assert_eq!(cert_names(&both), ["billing-1.internal", "b1.internal"]);
        let cn_only = cert(&[], Some("Legacy-Client"));
        assert_eq!(cert_names(&cn_only), ["legacy-client"]);
        assert!(cert_names(&cert(&[], None)).is_empty());
        assert!(cert_names(&CertificateDer::from(vec![0x30, 0x03, 1, 2])).is_empty());
    }

    /// Against the generator: rcgen writes the validity it was given (UTCTime before 2050,
    /// GeneralizedTime from 2050), and the reading gives it back to the second.
    #[test]
    fn not_after_reads_back_what_the_certificate_was_made_with() {
        for (y, m, d) in [(2030, 2, 28), (2049, 12, 31), (2050, 1, 1), (2100, 6, 15)] {
            let mut params = rcgen::CertificateParams::new(vec!["a.test".to_owned()]).unwrap();
            params.not_after = rcgen::date_time_ymd(y, m, d);
            let key = rcgen::KeyPair::generate().unwrap();
            let der = params.self_signed(&key).unwrap().der().clone();
            let expected = days_from_civil(i64::from(y), i64::from(m), i64::from(d)) * 86_400;
            assert_eq!(not_after(&der), Some(expected), "{y}-{m}-{d}");
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        for end in 0..40 {
            let der = CertificateDer::from(vec![0x30; end]);
            assert_eq!(not_after(&der), None);
        }
    }

    #[test]
    fn common_name_survives_truncated_and_odd_input() {
        // SET { SEQUENCE { OID 2.5.4.3, UTF8String "ab" } }
        let name = [
            0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x02, b'a', b'b',
        ];
        assert_eq!(common_name(&name).as_deref(), Some("ab"));
        for end in 0..name.len() {
            assert_eq!(common_name(&name[..end]), None, "prefix of {end} bytes");
        }
        assert_eq!(common_name(&[0x31, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        let mut bmp = name;
        bmp[9] = 0x1e; // BMPString: not read
        assert_eq!(common_name(&bmp), None);
    }
}
