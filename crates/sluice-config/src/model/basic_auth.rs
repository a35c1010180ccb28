//! A route's `basic_auth`: who may use it, from an htpasswd file.

/// `basic_auth = { htpasswd = "users.htpasswd", realm = "admin" }`: a request without the
/// credentials of one of `users` is answered 401 with `WWW-Authenticate: Basic`.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicAuth {
    /// The realm the client is told.
    pub realm: String,
    /// Each user's name and password hash: bcrypt (`$2y$…`, `htpasswd -B`) or argon2 in PHC
    /// form (`$argon2id$…`), in file order.
    pub users: Vec<(String, String)>,
}

impl std::fmt::Debug for BasicAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.users.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("BasicAuth")
            .field("realm", &self.realm)
            .field("users", &names)
            .finish()
    }
}
