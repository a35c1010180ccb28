//! What an SDK's acceptor address names (`protocol/README.md`, "The acceptor address"): one
//! node, every record of a DNS name, or a list.

use std::fmt;

/// A parsed acceptor address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `host:port`: one node, resolved on each dial; no control link.
    Single(String),
    /// `dns:NAME:PORT`: every A and AAAA record of `name`, re-resolved periodically.
    Dns {
        /// The name to resolve.
        name: String,
        /// The acceptor port on every node.
        port: u16,
    },
    /// `a:port,b:port,…`: each entry, and each address an entry's name resolves to.
    List(Vec<String>),
}

/// An address that names no node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid acceptor address {address:?}: {why}")]
pub struct InvalidAddress {
    /// The address as given.
    pub address: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single(a) => f.write_str(a),
            Self::Dns { name, port } => write!(f, "dns:{name}:{port}"),
            Self::List(all) => f.write_str(&all.join(",")),
        }
    }
}

impl Address {
    /// Reads `text`; says what is wrong with it otherwise.
    pub fn parse(text: &str) -> Result<Self, InvalidAddress> {
        let err = |why| InvalidAddress {
            address: text.to_owned(),
            why,
        };
        if let Some(rest) = text.strip_prefix("dns:") {
            let (name, port) = rest.rsplit_once(':').ok_or(err("dns: needs NAME:PORT"))?;
            if name.is_empty() || name.contains([',', ' ']) {
                return Err(err("dns: needs a name"));
            }
            return Ok(Self::Dns {
                name: name.to_owned(),
                port: port_of(port).ok_or(err("the port must be 1 to 65535"))?,
            });
        }
        let entries: Vec<&str> = text.split(',').map(str::trim).collect();
        for entry in &entries {
            host_port(entry).map_err(err)?;
        }
        Ok(match entries.as_slice() {
            [one] => Self::Single((*one).to_owned()),
            many => Self::List(many.iter().map(|e| (*e).to_owned()).collect()),
        })
    }

    /// Whether the address names several nodes (and so control links are used).
    pub fn is_many(&self) -> bool {
        !matches!(self, Self::Single(_))
    }
}

/// One `host:port` entry: a non-empty host (a bracketed IPv6 address, or a name or IPv4
/// address without spaces) and a port of 1 to 65535.
fn host_port(entry: &str) -> Result<(), &'static str> {
    if entry.is_empty() {
        return Err("an empty entry");
    }
    if entry.starts_with("dns:") {
        return Err("dns: is a whole address, not a list entry");
    }
    let (host, port) = entry.rsplit_once(':').ok_or("each entry needs host:port")?;
    let bad_host = host.is_empty()
        || host.contains([' ', '/'])
        || (host.contains(':') && !(host.starts_with('[') && host.ends_with(']')));
    if bad_host {
        return Err("each entry needs host:port");
    }
    port_of(port)
        .map(|_| ())
        .ok_or("the port must be 1 to 65535")
}

fn port_of(text: &str) -> Option<u16> {
    let port: u16 = text
        .parse()
        .ok()
        .filter(|_| text.bytes().all(|b| b.is_ascii_digit()))?;
    (port != 0).then_some(port)
}
