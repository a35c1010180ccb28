//! A route's `basic_auth = { htpasswd, realm }`: the users file read and checked now, so a
//! bad line is a configuration error and not a 401 for everyone.

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::BasicAuth;
use crate::raw::RawBasicAuth;

pub(super) fn basic_auth(
    ctx: Ctx<'_>,
    raw: Spanned<RawBasicAuth>,
) -> Result<BasicAuth, ConfigError> {
    let raw = raw.into_inner();
    let path = ctx.resolve(raw.htpasswd.get_ref());
    let text = std::fs::read_to_string(&path).map_err(|e| {
        let msg = format!("cannot read the users file {}: {e}", path.display());
        ctx.err(raw.htpasswd.span(), msg)
    })?;
    let users = users(&text).map_err(|(line, msg)| {
        let msg = format!("{}:{line}: {msg}", path.display());
        ctx.err(raw.htpasswd.span(), msg)
    })?;
    if users.is_empty() {
        let msg = format!("{} names no user: nobody could pass", path.display());
        return Err(ctx.err(raw.htpasswd.span(), msg));
    }
    let realm = raw.realm.unwrap_or_else(|| "Restricted".to_owned());
    if realm.contains(['"', '\\']) || realm.chars().any(char::is_control) {
        let msg = "the realm may not contain quotes, backslashes or control characters";
        return Err(ctx.err(raw.htpasswd.span(), msg));
    }
    Ok(BasicAuth { realm, users })
}

/// `name:hash` lines (blank lines and `#` comments skipped); the line number of the first bad
/// one and why.
fn users(text: &str) -> Result<Vec<(String, String)>, (usize, String)> {
    let mut users: Vec<(String, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |msg: String| (n + 1, msg);
        let (name, hash) = line
            .split_once(':')
            .ok_or_else(|| bad("not `name:hash`".to_owned()))?;
        if name.is_empty() {
            return Err(bad("a user without a name".to_owned()));
        }
        if users.iter().any(|(u, _)| u == name) {
            return Err(bad(format!("user `{name}` appears twice")));
        }
        hash_kind(hash).map_err(bad)?;
        users.push((name.to_owned(), hash.to_owned()));
    }
    Ok(users)
}

/// bcrypt (`$2a$`, `$2b$`, `$2y$`, `$2x$`, 60 characters) or argon2 in PHC form.
fn hash_kind(hash: &str) -> Result<(), String> {
    let bcrypt = ["$2a$", "$2b$", "$2y$", "$2x$"]
        .iter()
        .any(|p| hash.starts_with(p));
    if bcrypt && hash.len() == 60 {
        return Ok(());
    }
    let argon2 = ["$argon2id$", "$argon2i$", "$argon2d$"]
        .iter()
        .any(|p| hash.starts_with(p));
    if argon2 && hash.split('$').count() >= 5 {
        return Ok(());
    }
    let prefix: String = hash.chars().take(6).collect();
    Err(format!(
        "the hash `{prefix}…` is neither bcrypt nor argon2: make it with `htpasswd -B` (bcrypt) or an argon2 tool (MD5, SHA-1 and crypt hashes are refused)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BCRYPT: &str = "$2y$05$abcdefghijklmnopqrstuu5mL2KIfJ1QfZ3hbI6ab3o4LL7vAH2C2";

    #[test]
    fn users_are_name_and_hash_lines() {
        let argon = "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNo";
        let text = format!("# admins\n\nalice:{BCRYPT}\nbob:{argon}\n");
        let got = users(&text).map(|u| u.into_iter().map(|(n, _)| n).collect::<Vec<_>>());
        assert_eq!(got, Ok(vec!["alice".to_owned(), "bob".to_owned()]));
    }

    #[test]
    fn bad_lines_say_which_and_why() {
        let md5 = "carol:$apr1$xyz$abcdefghijklmnopqrstuv";
        for (text, line) in [
            (format!("alice:{BCRYPT}\n{md5}"), 2),
            (format!("alice:{BCRYPT}\nalice:{BCRYPT}"), 2),
            ("no colon here".to_owned(), 1),
            (format!(":{BCRYPT}"), 1),
            ("dave:$2y$05$short".to_owned(), 1),
        ] {
            assert_eq!(users(&text).map_err(|(n, _)| n), Err(line), "{text}");
        }
    }
}
