//! `sluice ctl`: a running Sluice's admin API from the shell — its status, draining an
//! instance, adding and removing a static cluster's endpoints, purging a route's cache.
//!
//! Each command is one HTTP/1.1 request ([`client`]); `status` renders the reply as tables
//! ([`status`]), a mutation as one line saying what happened, and `--json` prints the server's
//! JSON as it came (pretty) for scripts. Exit codes: 0 done, 1 the API or the connection
//! failed, 2 usage (clap's).

mod client;
mod status;
mod table;

use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde::Deserialize;
use serde_json::{json, Value};

use client::{AdminUrl, Client, Method, TOKEN_ENV};
use table::printable;

/// `sluice ctl`'s arguments. The bearer token is read from SLUICE_ADMIN_TOKEN, never from a
/// flag, so that it does not show in `ps`.
#[derive(Debug, Args)]
#[command(
    after_help = "When the admin API has a token ([admin] token), set SLUICE_ADMIN_TOKEN to it, or \
pass -c FILE: its [admin] token (e.g. file:/etc/sluice/admin.token) is used. Without --admin or \
-c, the packages' /etc/sluice/sluice.toml is read when it exists."
)]
pub(crate) struct CtlArgs {
    /// Base URL of the admin API ([admin] listen), plain http only. Default: the [admin] of
    /// --config, else http://127.0.0.1:9901.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "SLUICE_ADMIN",
        value_parser = AdminUrl::parse
    )]
    admin: Option<AdminUrl>,
    /// The running proxy's configuration file: its [admin] listen (and token, when
    /// SLUICE_ADMIN_TOKEN is unset) say where the admin API is. Default: the packages'
    /// /etc/sluice/sluice.toml when it exists, else http://127.0.0.1:9901 without a token.
    #[arg(short = 'c', long = "config", global = true, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Print the server's JSON reply (pretty) instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Show the listeners, the acceptor and each cluster's sessions, slices, instances and
    /// endpoints.
    Status,
    /// Drain an instance of a reverse cluster: it is never leased again, its idle sessions
    /// close now and its busy ones after their responses, and it stays out until `resume` (its
    /// SDKs are refused with 410 and probe once every 30 s meanwhile).
    Drain {
        /// The reverse cluster.
        cluster: String,
        /// The instance id it registered with.
        instance: String,
    },
    /// Let a drained instance register again: its SDKs probe once every 30 s while drained
    /// (`drained_probe`), so they come back by themselves within that, or at once when
    /// restarted.
    Resume {
        /// The reverse cluster.
        cluster: String,
        /// The drained instance's id.
        instance: String,
    },
    /// Add or remove an endpoint of a static cluster.
    #[command(subcommand)]
    Endpoints(EndpointsCommand),
    /// Drain this node: its `/ready` answers 503 until `resume-node`, so load balancers and
    /// Kubernetes stop sending it clients; requests and sessions carry on until it is stopped
    /// (SIGTERM).
    /// Then waits `--wait` for the balancers to notice before returning: a Kubernetes
    /// `preStop`, after which SIGTERM stops the node and its services move their sessions.
    DrainNode {
        /// How long to wait after draining, for balancers to stop sending clients.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// Undo `drain-node`: `/ready` answers as before (a stopping node cannot be resumed).
    ResumeNode,
    /// Re-read the configuration file and apply it without failing a request (a hot restart
    /// of the same binary); a file that does not load changes nothing and says why.
    Reload,
    /// List (the default), add or remove routes while the proxy runs (e.g. a client-CIDR
    /// slicing rule).
    Routes {
        #[command(subcommand)]
        command: Option<RoutesCommand>,
    },
    /// Purge a route's response cache: one key (--key), or every key under a prefix
    /// (--prefix). Keys are URLs as requests are stored: http://a.example/img/1.png?v=2
    /// (https on TLS listeners; the host as clients name it, with its port if they give one).
    Purge {
        /// The route whose `cache` is purged.
        route: String,
        /// The one key to remove (with its variants).
        #[arg(
            long,
            value_name = "URL",
            required_unless_present = "prefix",
            conflicts_with = "prefix"
        )]
        key: Option<String>,
        /// Remove every key that starts with this.
        #[arg(long, value_name = "URL")]
        prefix: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum RoutesCommand {
    /// The routes in match order (first match wins).
    List,
    /// Add a route, matched before every other one unless --position says otherwise.
    Add(RouteArgs),
    /// Remove the route NAME.
    #[command(visible_alias = "rm")]
    Del {
        /// The route's name.
        name: String,
    },
}

/// A route to add; its conditions combine (all must hold).
#[derive(Debug, Args)]
struct RouteArgs {
    /// Unique name.
    name: String,
    /// The cluster to forward to.
    #[arg(long)]
    cluster: String,
    /// The reverse cluster's slice (default: default).
    #[arg(long)]
    slice: Option<String>,
    /// Client networks, e.g. 192.168.0.0/24 (repeatable).
    #[arg(long = "cidr", value_name = "CIDR")]
    client_cidr: Vec<String>,
    /// Hosts, exact or *.suffix (repeatable).
    #[arg(long = "host", value_name = "HOST")]
    hosts: Vec<String>,
    /// Path prefix.
    #[arg(long = "path")]
    path_prefix: Option<String>,
    /// Methods (repeatable).
    #[arg(long = "method", value_name = "METHOD")]
    methods: Vec<String>,
    /// Where it goes in the match order: 0 first (the default).
    #[arg(long, default_value_t = 0)]
    position: usize,
}

#[derive(Debug, Subcommand)]
enum EndpointsCommand {
    /// Add ADDR to the cluster's endpoints (nothing changes if it is there already).
    Add {
        /// The static cluster.
        cluster: String,
        /// The endpoint, e.g. 127.0.0.1:9003.
        addr: String,
    },
    /// Remove ADDR from the cluster's endpoints.
    #[command(visible_alias = "rm")]
    Del {
        /// The static cluster.
        cluster: String,
        /// The endpoint, as `status` lists it.
        addr: String,
    },
}

/// Runs one `sluice ctl` command; errors go to stderr as `sluice ctl: ...` with exit code 1,
/// followed, once the admin API was chosen, by which one it was and how to choose another.
pub(crate) fn run(mut args: CtlArgs) -> ExitCode {
    if let CtlCommand::Routes { command: None } = args.command {
        args.command = CtlCommand::Routes {
            command: Some(RoutesCommand::List),
        };
    }
    let admin = match admin_of(&args) {
        Ok(admin) => admin,
        Err(e) => {
            eprintln!("sluice ctl: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let url = admin.url.clone();
    let source = admin.source.clone();
    match execute(args, admin) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice ctl: {e:#}");
            eprintln!(
                "sluice ctl: (admin API {url}, {source}; to use another, pass --admin URL, set SLUICE_ADMIN or pass -c FILE with its [admin])"
            );
            ExitCode::FAILURE
        }
    }
}

/// The admin API a command talks to, and what chose it.
struct Admin {
    url: AdminUrl,
    /// `--admin or SLUICE_ADMIN`, `[admin] of FILE` or `the default`.
    source: String,
    /// The token of the `[admin]` in --config, if any.
    token: Option<String>,
}

fn execute(args: CtlArgs, admin: Admin) -> anyhow::Result<()> {
    let token = std::env::var(TOKEN_ENV)
        .ok()
        .filter(|t| !t.is_empty())
        .or(admin.token);
    let client = Client::new(admin.url, token);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let reply = runtime.block_on(send(&client, &args.command))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(());
    }
    let text = match args.command {
        CtlCommand::Status => status::render(&parse(reply)?, client.url()),
        CtlCommand::Drain { .. } | CtlCommand::Resume { .. } => drained(parse(reply)?),
        CtlCommand::Endpoints(EndpointsCommand::Add { .. }) => added(parse(reply)?),
        CtlCommand::Endpoints(EndpointsCommand::Del { .. }) => removed(parse(reply)?),
        CtlCommand::Reload => format!(
            "reloaded: {}\n",
            printable(reply["message"].as_str().unwrap_or("done"))
        ),
        CtlCommand::ResumeNode => format!(
            "node {}: /ready answers as before the drain\n",
            printable(reply["node"].as_str().unwrap_or("ready"))
        ),
        CtlCommand::DrainNode { .. } => format!(
            "node {}: /ready answers 503 so balancers stop sending clients; stop it (SIGTERM) now\n",
            printable(reply["node"].as_str().unwrap_or("draining"))
        ),
        CtlCommand::Routes { command } => match command {
            None | Some(RoutesCommand::List) => routes_table(&reply),
            Some(RoutesCommand::Add(r)) => format!("added route {}\n", printable(&r.name)),
            Some(RoutesCommand::Del { name }) => format!("removed route {}\n", printable(&name)),
        },
        CtlCommand::Purge { route, .. } => format!(
            "purged {} key(s) from the cache of route {}\n",
            reply["purged"].as_u64().unwrap_or(0),
            printable(&route)
        ),
    };
    print!("{text}");
    Ok(())
}

/// Where the admin API is: --admin (or SLUICE_ADMIN), else the [admin] of --config, else the
/// default; and the token --config names, if any.
fn admin_of(args: &CtlArgs) -> anyhow::Result<Admin> {
    if let Some(url) = &args.admin {
        let source = match std::env::var_os("SLUICE_ADMIN") {
            Some(_) => "from --admin or SLUICE_ADMIN",
            None => "from --admin",
        };
        return Ok(Admin {
            url: url.clone(),
            source: source.to_owned(),
            token: None,
        });
    }
    let packaged = packaged_config(std::path::Path::new(PACKAGED_CONFIG))?;
    let Some(path) = args.config.as_ref().or(packaged.as_ref()) else {
        let url = AdminUrl::parse("http://127.0.0.1:9901").map_err(anyhow::Error::msg)?;
        return Ok(Admin {
            url,
            source: "the default".to_owned(),
            token: None,
        });
    };
    let config = sluice_config::load_file(path).map_err(|e| match is_permission(&e) {
        true => anyhow::anyhow!(
            "{e}\n(its admin token is readable by root and the group sluice: run as root, join the group, or set SLUICE_ADMIN_TOKEN)"
        ),
        false => anyhow::anyhow!("{e}"),
    })?;
    let Some(admin) = config.admin else {
        anyhow::bail!(
            "{} has no [admin] section: the proxy serves no admin API",
            path.display()
        );
    };
    let mut addr = admin.addr;
    if addr.ip().is_unspecified() {
        // Listening on every address: loopback reaches it.
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let url = AdminUrl::parse(&format!("http://{addr}")).map_err(anyhow::Error::msg)?;
    let token = admin
        .token
        .map(|t| String::from_utf8_lossy(&t.0).into_owned());
    Ok(Admin {
        url,
        source: format!("from the [admin] of {}", path.display()),
        token,
    })
}

/// Where the .deb installs the configuration, whose `[admin]` names the API and its token.
const PACKAGED_CONFIG: &str = "/etc/sluice/sluice.toml";

/// `path` when it exists, so that `sluice ctl` on a packaged host finds the admin API and its
/// token without flags; `None` when it does not. A file that exists but cannot be looked at
/// (a user outside the group sluice) is an error that says so, not a silent fallback to an
/// admin API without a token.
fn packaged_config(path: &std::path::Path) -> anyhow::Result<Option<std::path::PathBuf>> {
    match std::fs::metadata(path) {
        Ok(_) => Ok(Some(path.to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => anyhow::bail!(
            "cannot read {} ({e}): run as root or a member of the group sluice, or pass --admin URL with SLUICE_ADMIN_TOKEN",
            path.display()
        ),
    }
}

/// Whether a configuration failed to load for want of permission (its token file, say).
fn is_permission(e: &sluice_config::ConfigError) -> bool {
    e.to_string()
        .to_ascii_lowercase()
        .contains("permission denied")
}

/// The one request a command makes.
async fn send(client: &Client, command: &CtlCommand) -> anyhow::Result<Value> {
    use client::segment;
    match command {
        CtlCommand::Status => client.call(Method::GET, "/status", None).await,
        CtlCommand::Drain { cluster, instance } | CtlCommand::Resume { cluster, instance } => {
            let verb = match command {
                CtlCommand::Resume { .. } => "resume",
                _ => "drain",
            };
            let path = format!(
                "/clusters/{}/instances/{}/{verb}",
                segment(cluster),
                segment(instance)
            );
            client.call(Method::POST, &path, None).await
        }
        CtlCommand::Endpoints(EndpointsCommand::Add { cluster, addr }) => {
            let path = format!("/clusters/{}/endpoints", segment(cluster));
            let body = json!({ "addr": addr });
            client.call(Method::POST, &path, Some(body)).await
        }
        CtlCommand::Endpoints(EndpointsCommand::Del { cluster, addr }) => {
            let path = format!("/clusters/{}/endpoints/{}", segment(cluster), segment(addr));
            client.call(Method::DELETE, &path, None).await
        }
        CtlCommand::Reload => client.call(Method::POST, "/reload", None).await,
        CtlCommand::Purge { route, key, prefix } => {
            let path = format!("/routes/{}/cache/purge", segment(route));
            let body = match (key, prefix) {
                (Some(key), _) => json!({ "key": key }),
                (None, prefix) => json!({ "prefix": prefix }),
            };
            client.call(Method::POST, &path, Some(body)).await
        }
        CtlCommand::ResumeNode => client.call(Method::POST, "/resume", None).await,
        CtlCommand::DrainNode { wait } => {
            let reply = client.call(Method::POST, "/drain", None).await?;
            tokio::time::sleep(*wait).await;
            Ok(reply)
        }
        CtlCommand::Routes {
            command: None | Some(RoutesCommand::List),
        } => client.call(Method::GET, "/routes", None).await,
        CtlCommand::Routes {
            command: Some(RoutesCommand::Add(r)),
        } => {
            let mut body = json!({
                "name": r.name, "cluster": r.cluster, "client_cidr": r.client_cidr,
                "hosts": r.hosts, "methods": r.methods, "position": r.position,
            });
            if let Some(slice) = &r.slice {
                body["slice"] = json!(slice);
            }
            if let Some(path) = &r.path_prefix {
                body["path_prefix"] = json!(path);
            }
            client.call(Method::POST, "/routes", Some(body)).await
        }
        CtlCommand::Routes {
            command: Some(RoutesCommand::Del { name }),
        } => {
            let path = format!("/routes/{}", segment(name));
            client.call(Method::DELETE, &path, None).await
        }
    }
}

/// `GET /routes` as a table: name, conditions, target.
fn routes_table(reply: &Value) -> String {
    let words = |v: &Value| -> String {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    let mut rows = vec![vec![
        "ROUTE".to_owned(),
        "MATCH".to_owned(),
        "TARGET".to_owned(),
    ]];
    for r in reply["routes"].as_array().into_iter().flatten() {
        let mut when = Vec::new();
        for (key, label) in [
            ("hosts", "host"),
            ("methods", "method"),
            ("client_cidr", "client"),
        ] {
            let w = words(&r[key]);
            if !w.is_empty() {
                when.push(format!("{label}={w}"));
            }
        }
        if let Some(p) = r["path_prefix"].as_str() {
            when.push(format!("path={p}*"));
        }
        let target = match (r["cluster"].as_str(), r["slice"].as_str()) {
            (Some(c), Some(s)) => format!("{c} (slice {s})"),
            (Some(c), None) => c.to_owned(),
            (None, _) => "direct response".to_owned(),
        };
        let when = if when.is_empty() {
            "any".to_owned()
        } else {
            when.join(" ")
        };
        let name = r["name"].as_str().unwrap_or("?");
        rows.push(vec![printable(name), printable(&when), printable(&target)]);
    }
    rows.iter()
        .map(|row| {
            let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
            let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0);
            format!("{:<w0$}  {:<w1$}  {}\n", row[0], row[1], row[2])
        })
        .collect()
}

/// Reads a successful reply into the shape its command expects.
fn parse<T: serde::de::DeserializeOwned>(reply: Value) -> anyhow::Result<T> {
    serde_json::from_value(reply).map_err(|e| {
        anyhow::anyhow!("the admin API's reply is not what this sluice ctl expects ({e}); --json prints it as it is")
    })
}

/// `POST .../drain`'s and `POST .../resume`'s reply.
#[derive(Debug, Deserialize)]
struct Drained {
    cluster: String,
    instance: String,
    draining: bool,
}

fn drained(r: Drained) -> String {
    let (instance, cluster) = (printable(&r.instance), printable(&r.cluster));
    match r.draining {
        true => format!(
            "draining instance {instance} of cluster {cluster}; it stays out until `sluice ctl resume {cluster} {instance}`\n"
        ),
        false => format!("resumed instance {instance} of cluster {cluster}: its SDKs register again at their next probe (within 30 s by default), or at once when restarted\n"),
    }
}

/// `POST .../endpoints`' reply.
#[derive(Debug, Deserialize)]
struct Added {
    cluster: String,
    addr: String,
    /// The addresses a `host:port` resolved to (older servers do not say).
    #[serde(default)]
    addrs: Vec<String>,
    added: bool,
}

fn added(r: Added) -> String {
    let (mut addr, cluster) = (printable(&r.addr), printable(&r.cluster));
    if !r.addrs.is_empty() && r.addrs != [r.addr.as_str()] {
        addr = format!("{addr} ({})", printable(&r.addrs.join(", ")));
    }
    match r.added {
        true => format!("added endpoint {addr} to cluster {cluster}\n"),
        false => format!("endpoint {addr} was already in cluster {cluster}: nothing changed\n"),
    }
}

/// `DELETE .../endpoints/{addr}`'s reply.
#[derive(Debug, Deserialize)]
struct Removed {
    cluster: String,
    addr: String,
    removed: bool,
}

fn removed(r: Removed) -> String {
    let (addr, cluster) = (printable(&r.addr), printable(&r.cluster));
    match r.removed {
        true => format!("removed endpoint {addr} from cluster {cluster}\n"),
        false => format!("endpoint {addr} was not in cluster {cluster}: nothing changed\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packaged_configuration_is_read_when_it_exists() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("sluice.toml");
        assert!(packaged_config(&path)?.is_none(), "absent: the default");
        std::fs::write(&path, "")?;
        assert_eq!(packaged_config(&path)?, Some(path));
        Ok(())
    }
}
