//! `sluice ctl`: a running Sluice's admin API from the shell — its status, draining an
//! instance, adding and removing a static cluster's endpoints.
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
    after_help = "When the admin API has a token ([admin] token), set SLUICE_ADMIN_TOKEN to it."
)]
pub(crate) struct CtlArgs {
    /// Base URL of the admin API ([admin] listen), plain http only.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "SLUICE_ADMIN",
        default_value = "http://127.0.0.1:9901",
        value_parser = AdminUrl::parse
    )]
    admin: AdminUrl,
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
    /// close now and its busy ones after their responses.
    Drain {
        /// The reverse cluster.
        cluster: String,
        /// The instance id it registered with.
        instance: String,
    },
    /// Add or remove an endpoint of a static cluster.
    #[command(subcommand)]
    Endpoints(EndpointsCommand),
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

/// Runs one `sluice ctl` command; errors go to stderr as `sluice ctl: ...` with exit code 1.
pub(crate) fn run(args: CtlArgs) -> ExitCode {
    match execute(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice ctl: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn execute(args: CtlArgs) -> anyhow::Result<()> {
    let token = std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty());
    let client = Client::new(args.admin, token);
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
        CtlCommand::Drain { .. } => drained(parse(reply)?),
        CtlCommand::Endpoints(EndpointsCommand::Add { .. }) => added(parse(reply)?),
        CtlCommand::Endpoints(EndpointsCommand::Del { .. }) => removed(parse(reply)?),
    };
    print!("{text}");
    Ok(())
}

/// The one request a command makes.
async fn send(client: &Client, command: &CtlCommand) -> anyhow::Result<Value> {
    use client::segment;
    match command {
        CtlCommand::Status => client.call(Method::GET, "/status", None).await,
        CtlCommand::Drain { cluster, instance } => {
            let path = format!(
                "/clusters/{}/instances/{}/drain",
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
    }
}

/// Reads a successful reply into the shape its command expects.
fn parse<T: serde::de::DeserializeOwned>(reply: Value) -> anyhow::Result<T> {
    serde_json::from_value(reply).map_err(|e| {
        anyhow::anyhow!("the admin API's reply is not what this sluice ctl expects ({e}); --json prints it as it is")
    })
}

/// `POST .../drain`'s reply.
#[derive(Debug, Deserialize)]
struct Drained {
    cluster: String,
    instance: String,
    draining: bool,
}

fn drained(r: Drained) -> String {
    let (instance, cluster) = (printable(&r.instance), printable(&r.cluster));
    match r.draining {
        true => format!("draining instance {instance} of cluster {cluster}\n"),
        false => format!("instance {instance} of cluster {cluster} is not draining\n"),
    }
}

/// `POST .../endpoints`' reply.
#[derive(Debug, Deserialize)]
struct Added {
    cluster: String,
    addr: String,
    added: bool,
}

fn added(r: Added) -> String {
    let (addr, cluster) = (printable(&r.addr), printable(&r.cluster));
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
