//! `[handoff]`: the standalone acceptor's socket for consumers, who may open it (`mode`,
//! `group`) and whose peers it accepts (`allowed_uids`, besides its own uid).

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::HandoffServer;
use crate::raw::RawHandoff;
use crate::values::{FileMode, GroupSpec};

/// The socket file's mode unless `mode` says otherwise: the owner only.
const DEFAULT_MODE: u32 = 0o600;

pub(super) fn handoff(ctx: Ctx<'_>, raw: RawHandoff) -> Result<HandoffServer, ConfigError> {
    let group = raw.group.as_ref().map(|g| gid(ctx, g)).transpose()?;
    Ok(HandoffServer {
        path: ctx.resolve(raw.listen.get_ref()),
        allowed_uids: raw.allowed_uids.unwrap_or_default(),
        mode: raw.mode.map_or(DEFAULT_MODE, |FileMode(m)| m),
        group,
    })
}

/// A gid as written, or the gid of the group named (looked up on this host).
fn gid(ctx: Ctx<'_>, raw: &Spanned<GroupSpec>) -> Result<u32, ConfigError> {
    let name = match raw.get_ref() {
        GroupSpec::Id(gid) => return Ok(*gid),
        GroupSpec::Name(name) => name,
    };
    match nix::unistd::Group::from_name(name) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(ctx.err(
            raw.span(),
            format!("unknown group `{name}` (not on this host); give a group name from /etc/group or a numeric gid"),
        )),
        Err(e) => Err(ctx.err(raw.span(), format!("cannot look up group `{name}`: {e}"))),
    }
}
