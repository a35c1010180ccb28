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
