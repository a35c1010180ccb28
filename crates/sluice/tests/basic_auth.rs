//! A route's `basic_auth` (issue 33, item 5): only the users of an htpasswd file (bcrypt or
//! argon2 hashes) get through; anyone else is answered 401 with `WWW-Authenticate: Basic`,
//! never reaches the upstream, and keeps the connection. The test command runs these on the
//! fast path and again with it off (hyper).
#![allow(clippy::unwrap_used)]

use crate::support;

use base64::Engine as _;
use support::{Backend, TestProxy};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// alice (bcrypt, cost 4 so that a debug build verifies it quickly) and bob (argon2, small
/// parameters), in a users file in `dir`.
fn users(dir: &std::path::Path) {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let alice = bcrypt::hash("alice-secret", 4).unwrap();
    let salt = SaltString::from_b64("c2FsdHNhbHRzYWx0").unwrap();
    let params = argon2::Params::new(64, 1, 1, None).unwrap();
    let hasher = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let bob = hasher
        .hash_password(b"bob-secret", &salt)
        .unwrap()
        .to_string();
    let text = format!("# admins\nalice:{alice}\nbob:{bob}\n");
    std::fs::write(dir.join("users.htpasswd"), text).unwrap();
}

async fn proxy(backend: &Backend, dir: &std::path::Path) -> TestProxy {
    users(dir);
    let toml = format!(
        "[[listener]]\nname = \"public\"\nlisten = \"127.0.0.1:0\"\n\
         [[route]]\nname = \"admin\"\npath_prefix = \"/headers\"\ncluster = \"backend\"\n\
         basic_auth = {{ htpasswd = \"users.htpasswd\", realm = \"admin area\" }}\n\
         [[route]]\nname = \"open\"\ncluster = \"backend\"\n\
         [cluster.backend]\nkind = \"static\"\nendpoints = [\"{}\"]\n",
        backend.addr
    );
    TestProxy::start_in(&toml, dir).await
}

fn basic(name: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{name}:{password}"));
    format!("Authorization: Basic {token}\r\n")
}

async fn get(conn: &mut TcpStream, path: &str, fields: &str) -> String {
    let req = format!("GET {path} HTTP/1.1\r\nHost: a\r\n{fields}\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    support::read_answer(conn).await.expect("closed")
}

fn status(answer: &str) -> &str {
    answer.split(' ').nth(1).unwrap_or_default()
}

#[tokio::test]
async fn without_a_users_credentials_the_answer_is_401_and_the_upstream_sees_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend, dir.path()).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    for fields in [
        String::new(),
        basic("alice", "wrong"),
        basic("mallory", "alice-secret"),
        "Authorization: Bearer alice-secret\r\n".to_owned(),
        "Authorization: Basic !!!not-base64\r\n".to_owned(),
    ] {
        let answer = get(&mut conn, "/headers", &fields).await;
        assert_eq!(status(&answer), "401", "{fields}: {answer}");
        let challenge = "www-authenticate: Basic realm=\"admin area\", charset=\"UTF-8\"";
        assert!(
            answer
                .to_ascii_lowercase()
                .contains(&challenge.to_ascii_lowercase()),
            "{answer}"
        );
        assert!(
            !answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    assert_eq!(
        backend.requests(),
        0,
        "a refused request reached the backend"
    );
    // The same connection goes on, and other routes need nothing.
    assert_eq!(status(&get(&mut conn, "/open", "").await), "200");
}

#[tokio::test]
async fn bcrypt_and_argon2_users_get_through_with_their_field_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::start("b").await;
    let proxy = proxy(&backend, dir.path()).await;
    let mut conn = TcpStream::connect(proxy.addr()).await.unwrap();
    for (name, password) in [("alice", "alice-secret"), ("bob", "bob-secret")] {
        // Twice: the second is the remembered password's path.
        for _ in 0..2 {
            let fields = basic(name, password);
            let answer = get(&mut conn, "/headers", &fields).await;
            assert_eq!(status(&answer), "200", "{name}: {answer}");
            let sent = fields.trim_end().to_ascii_lowercase();
            assert!(answer.to_ascii_lowercase().contains(&sent), "{answer}");
        }
    }
    // A remembered password is the right one only: another is checked, and refused.
    let answer = get(&mut conn, "/headers", &basic("alice", "alice-secreT")).await;
    assert_eq!(status(&answer), "401");
    if let Some(served) = support::fast_path_served(&proxy.metrics) {
        assert_eq!(served, 5, "the fast path did not take them all");
    }
}
