//! A route's `basic_auth`: the rule of both data paths. A request passes with the `Basic`
//! credentials of one of the route's users (RFC 7617), checked against the user's bcrypt or
//! argon2 hash; otherwise it is answered 401 with `WWW-Authenticate: Basic realm=…`.
//!
//! Hashes are slow on purpose (bcrypt at `htpasswd -B`'s cost takes tens of milliseconds), so
//! a verification runs on the blocking pool, at most one per core at a time, never on the
//! request's thread; and a password once verified is remembered as its SHA-256 (never in
//! clear), so a client's every later request costs a hash, not a bcrypt. A name nobody has
//! costs a verification too, against the dearest of the route's hashes (a file may mix
//! bcrypt costs and argon2), so timing does not tell which names exist.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use base64::Engine as _;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use crate::error::ProxyError;
use crate::fields::Fields;
use crate::route_feature::{Asked, Hooks, Registration, RouteFeature, Verdict};

/// How many verified passwords are remembered; past it the memory starts afresh.
const REMEMBERED: usize = 1024;

/// One route's users and what has been verified of them.
pub struct BasicAuth {
    config: sluice_config::BasicAuth,
    users: HashMap<String, Arc<str>>,
    /// Each user's last verified password, as SHA-256 of `name:password`.
    verified: Mutex<HashMap<String, [u8; 32]>>,
    verifying: Arc<Semaphore>,
    /// What a name nobody has is checked against: the dearest hash, found on first need.
    decoy: Arc<OnceLock<Arc<str>>>,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BasicAuth")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl BasicAuth {
    pub fn new(config: &sluice_config::BasicAuth) -> Self {
        let users = config
            .users
            .iter()
            .map(|(name, hash)| (name.clone(), Arc::from(hash.as_str())))
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self {
            config: config.clone(),
            users,
            verified: Mutex::new(HashMap::new()),
            verifying: Arc::new(Semaphore::new(cores)),
            decoy: Arc::default(),
        }
    }

    /// Passes a request whose `Authorization` field is `field` when it names a user with
    /// the right password.
    pub async fn check(&self, field: Option<&[u8]>) -> Result<(), ProxyError> {
        let refused = || ProxyError::Unauthorized {
            realm: self.config.realm.clone(),
        };
        let (name, password) = field.and_then(credentials).ok_or_else(refused)?;
        let digest = digest(&name, &password);
        if self.remembers(&name, &digest) {
            return Ok(());
        }
        // A name nobody has is checked against the dearest hash all the same, and fails.
        let known = self.users.get(&name).cloned();
        if known.is_none() && self.users.is_empty() {
            return Err(refused());
        }
        let is_known = known.is_some();
        let decoy = Arc::clone(&self.decoy);
        let hashes: Vec<Arc<str>> = match is_known {
            true => Vec::new(),
            false => self.users.values().cloned().collect(),
        };
        let permit = Arc::clone(&self.verifying).acquire_owned().await;
        let verified = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let hash = known.unwrap_or_else(|| Arc::clone(decoy.get_or_init(|| dearest(&hashes))));
            verify(&password, &hash)
        })
        .await
        .unwrap_or(false);
        if !(is_known && verified) {
            return Err(refused());
        }
        let mut remembered = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if remembered.len() >= REMEMBERED {
            remembered.clear();
        }
        remembered.insert(name, digest);
        Ok(())
    }

    fn remembers(&self, name: &str, digest: &[u8; 32]) -> bool {
        let remembered = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        remembered
            .get(name)
            .is_some_and(|d| bool::from(d.ct_eq(digest)))
    }
}

/// The name and password of a `Basic` field (the scheme in any case, RFC 9110 §11.1).
fn credentials(field: &[u8]) -> Option<(String, Vec<u8>)> {
    let text = std::str::from_utf8(field).ok()?.trim();
    let (scheme, token) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let colon = decoded.iter().position(|b| *b == b':')?;
    let name = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((name, decoded[colon + 1..].to_vec()))
}

/// The hash whose verification takes longest: one of each kind and cost (bcrypt's `$2b$10$`,
/// argon2's parameters) is timed once, as the kinds' costs have no common scale to compare
/// on paper. `hashes` is not empty.
fn dearest(hashes: &[Arc<str>]) -> Arc<str> {
    let mut classes: HashMap<&str, &Arc<str>> = HashMap::new();
    for hash in hashes {
        classes.entry(cost_class(hash)).or_insert(hash);
    }
    let timed = classes.into_values().map(|hash| {
        let started = Instant::now();
        verify(b"\0not a password", hash);
        (started.elapsed(), hash)
    });
    let slowest = timed.max_by_key(|(took, _)| *took);
    slowest.map_or_else(|| Arc::from(""), |(_, hash)| Arc::clone(hash))
}

/// What decides a hash's cost: bcrypt's version and cost (`$2b$10$`), argon2's variant,
/// version and parameters (all but the salt and the hash).
fn cost_class(hash: &str) -> &str {
    if hash.starts_with("$argon2") {
        return hash.rsplitn(3, '$').nth(2).unwrap_or(hash);
    }
    hash.get(..7).unwrap_or(hash)
}

fn digest(name: &str, password: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(name.as_bytes());
    ctx.update(b":");
    ctx.update(password);
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// The registration of a route's `basic_auth` (`sluice`'s `registry::REGISTERED`), built
/// with the `basic-auth` cargo feature.
pub const REGISTRATION: Registration = Registration {
    key: "basic_auth",
    cargo_feature: Some("basic-auth"),
    built: cfg!(feature = "basic-auth"),
    wanted: |route| route.basic_auth.is_some(),
    build: |route, _| {
        let users = route
            .basic_auth
            .as_ref()
            .filter(|_| cfg!(feature = "basic-auth"))?;
        Some(Arc::new(BasicAuth::new(users)) as Arc<dyn RouteFeature>)
    },
};

/// A password's check waits for its hash (on the blocking pool), then passes or refuses.
impl RouteFeature for BasicAuth {
    fn name(&self) -> &'static str {
        "basic_auth"
    }

    fn hooks(&self) -> Hooks {
        Hooks::REFUSE.and(Hooks::WAIT)
    }

    fn admit<'a>(&'a self, asked: &Asked<'a>) -> Verdict<'a> {
        let field = asked.fields.first("authorization");
        Verdict::Check(Box::pin(
            async move { self.check(field).await.map(|()| None) },
        ))
    }
}

/// Whether `password` is the one `hash` (bcrypt or argon2, as the configuration checked) was
/// made from.
#[cfg(feature = "basic-auth")]
fn verify(password: &[u8], hash: &str) -> bool {
    if hash.starts_with("$argon2") {
        use argon2::password_hash::{PasswordHash, PasswordVerifier};
        return PasswordHash::new(hash).is_ok_and(|parsed| {
            argon2::Argon2::default()
                .verify_password(password, &parsed)
                .is_ok()
        });
    }
    bcrypt::verify(password, hash).unwrap_or(false)
}

/// Built without the `basic-auth` feature, no hash can be verified: nobody gets in (fails
/// closed; `sluice::Proxy` refuses a configuration with `basic_auth` in such a build first).
#[cfg(not(feature = "basic-auth"))]
fn verify(_password: &[u8], _hash: &str) -> bool {
    false
}

#[cfg(all(test, feature = "basic-auth"))]
mod tests {
    use super::*;

    fn field(name: &str, password: &str) -> Vec<u8> {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{name}:{password}"));
        format!("Basic {token}").into_bytes()
    }

    #[test]
    fn credentials_are_read_from_a_basic_field_in_any_case() {
        let got = credentials(&field("alice", "pa:ss"));
        assert_eq!(got, Some(("alice".to_owned(), b"pa:ss".to_vec())));
        assert!(credentials(b"bAsIc YWxpY2U6eA==").is_some());
        for bad in [
            &b"Bearer abc"[..],
            b"Basic",
            b"Basic !!!",
            b"Basic YWxpY2U=",
        ] {
            assert_eq!(credentials(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    /// Issue 47's probe: an unknown name was checked against whichever hash came first, so
    /// with cheap and dear hashes mixed its time told that the name does not exist.
    #[test]
    fn an_unknown_name_is_checked_against_the_dearest_hash() {
        let cheap: Arc<str> = Arc::from(bcrypt::hash("a", 4).unwrap_or_default());
        let dear: Arc<str> = Arc::from(bcrypt::hash("b", 12).unwrap_or_default());
        let got = dearest(&[Arc::clone(&cheap), Arc::clone(&cheap), Arc::clone(&dear)]);
        assert_eq!(got, dear, "bcrypt cost 12 is 256 times cost 4");
        let got = dearest(&[Arc::clone(&dear), Arc::clone(&cheap)]);
        assert_eq!(got, dear);
        assert_eq!(cost_class(&cheap), "$2b$04$");
        let argon = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0$aGFzaA";
        assert_eq!(cost_class(argon), "$argon2id$v=19$m=19456,t=2,p=1");
    }

    #[test]
    fn bcrypt_and_argon2_hashes_verify_their_password_only() {
        let bcrypt = bcrypt::hash("secret", 4).unwrap_or_default();
        assert!(verify(b"secret", &bcrypt));
        assert!(!verify(b"Secret", &bcrypt));
        use argon2::password_hash::{PasswordHasher, SaltString};
        let salt = SaltString::from_b64("c2FsdHNhbHRzYWx0").unwrap_or_else(|_| unreachable!());
        let argon = argon2::Argon2::default()
            .hash_password(b"secret", &salt)
            .map(|h| h.to_string())
            .unwrap_or_default();
        assert!(verify(b"secret", &argon));
        assert!(!verify(b"other", &argon));
    }
}
