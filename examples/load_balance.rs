//! Load balancing: one upstream of three instances, picked in turn, behind a response hook.
//!
//! `cargo run -p sluice-examples --example load_balance -- [--listen ADDR] [--upstream ADDR]...`
//! Without `--upstream` it starts three demo backends; `curl -i localhost:8080/` a few times.

use std::error::Error;
use std::sync::Arc;

use http::{HeaderValue, Response};
use sluice::{os_signal, LbPolicy, StaticOptions};
use sluice::{Group, ProxyBody, ProxyService, RequestHead, Route, Routing, StaticCluster};
use sluice_examples::{Args, GRACE};
use tower::util::MapResponseLayer;
use tower::ServiceBuilder;

/// Sends every request to the one route it holds.
struct Always(Arc<Route>);

impl Routing for Always {
    fn route(&self, _head: &RequestHead<'_>) -> Option<Arc<Route>> {
        Some(Arc::clone(&self.0))
    }
}

/// The response hook: marks every response, the proxy's own error responses included.
fn mark(mut res: Response<ProxyBody>) -> Response<ProxyBody> {
    let value = HeaderValue::from_static("sluice-example");
    res.headers_mut().insert("x-proxied-by", value);
    res
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    sluice_examples::init_logging();
    // Installed first, so a signal during start-up drains instead of killing the process.
    let stop = os_signal();
    let args = Args::from_env(&["listen", "upstream"])?;
    let listen = args.addr("listen", "127.0.0.1:8080")?;
    let upstreams = args.addrs("upstream")?;
    let mut group = Group::new();
    let names = ["backend-1", "backend-2", "backend-3"];
    let upstreams = sluice_examples::upstreams_or_demo(&mut group, upstreams, &names).await?;

    let opts = StaticOptions {
        lb: LbPolicy::RoundRobin,
        ..StaticOptions::default()
    };
    let cluster = StaticCluster::new("backends", upstreams, opts)?;
    let proxy = ProxyService::new(Always(Route::to_upstream("all", cluster)));
    // Hooks are tower layers around the proxy; add request hooks the same way.
    let service = ServiceBuilder::new()
        .layer(MapResponseLayer::new(mark))
        .service(proxy);

    let server = sluice_examples::bind("proxy", listen).await?;
    group.add(server, service, GRACE);
    // Ctrl-C or SIGTERM: stop accepting, finish in-flight requests, exit 0.
    group.run_until(stop).await;
    Ok(())
}
