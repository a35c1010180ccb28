//! Host routing: two upstreams chosen by the Host header; any other host gets 404.
//!
//! `cargo run -p sluice-examples --example host_routing -- [--listen ADDR]
//! [--a-upstream ADDR]... [--b-upstream ADDR]...`; without upstreams it starts a demo backend
//! for each host. Then `curl -H 'Host: a.example' localhost:8080/`.

use std::error::Error;
use std::sync::Arc;

use sluice::os_signal;
use sluice::{Group, ProxyService, RequestHead, Route, Routing, StaticCluster, StaticOptions};
use sluice_examples::{upstreams_or_demo, Args, GRACE};

/// Routes `a.example` to one cluster and `b.example` to the other.
struct ByHost {
    a: Arc<Route>,
    b: Arc<Route>,
}

impl Routing for ByHost {
    fn route(&self, head: &RequestHead<'_>) -> Option<Arc<Route>> {
        // `host` is already lowercase and without the port; `None` answers 404.
        match head.host? {
            "a.example" => Some(Arc::clone(&self.a)),
            "b.example" => Some(Arc::clone(&self.b)),
            _ => None,
        }
    }
}

fn route(name: &str, upstreams: Vec<std::net::SocketAddr>) -> std::io::Result<Arc<Route>> {
    let cluster = StaticCluster::new(name, upstreams, StaticOptions::default())?;
    Ok(Route::to_upstream(name, cluster))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    sluice_examples::init_logging();
    // Installed first, so a signal during start-up drains instead of killing the process.
    let stop = os_signal();
    let args = Args::from_env(&["listen", "a-upstream", "b-upstream"])?;
    let listen = args.addr("listen", "127.0.0.1:8080")?;
    let (a, b) = (args.addrs("a-upstream")?, args.addrs("b-upstream")?);
    let mut group = Group::new();
    let a = upstreams_or_demo(&mut group, a, &["backend-a"]).await?;
    let b = upstreams_or_demo(&mut group, b, &["backend-b"]).await?;
    let router = ByHost {
        a: route("a", a)?,
        b: route("b", b)?,
    };

    let server = sluice_examples::bind("proxy", listen).await?;
    group.add(server, ProxyService::new(router), GRACE);
    group.run_until(stop).await;
    Ok(())
}
