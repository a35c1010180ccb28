//! Dynamic upstreams: a control endpoint adds and removes the proxy's upstreams at runtime.
//!
//! `cargo run -p sluice-examples --example dynamic_upstreams -- [--listen ADDR]
//! [--control ADDR] [--upstream ADDR]...`; without upstreams it starts two demo backends.
//! `curl localhost:8081/upstreams` lists them, `curl -X DELETE
//! 'localhost:8081/upstreams?addr=IP:PORT'` removes one and `-X POST` adds it back.
//! The proxy and the control server share one `Group`: Ctrl-C drains both.

use std::convert::Infallible;
use std::error::Error;
use std::net::SocketAddr;

use http::{header, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use sluice::{os_signal, LbPolicy, Matcher, RouteTable, StaticOptions};
use sluice::{Group, ProxyBody, ProxyService, Route, StaticCluster};
use sluice_examples::{upstreams_or_demo, Args, GRACE};
use tracing::info;

/// `GET /upstreams` lists the endpoints, one a line; `POST` and `DELETE
/// /upstreams?addr=IP:PORT` add and remove one.
fn control(cluster: &StaticCluster, req: &Request<Incoming>) -> Response<ProxyBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/upstreams") => reply(StatusCode::OK, &list(cluster)),
        (&Method::POST, "/upstreams") => with_addr(req.uri(), |addr| {
            if cluster.add_endpoint(addr) {
                (StatusCode::CREATED, "added\n")
            } else {
                (StatusCode::OK, "already an upstream\n")
            }
        }),
        (&Method::DELETE, "/upstreams") => with_addr(req.uri(), |addr| {
            if cluster.remove_endpoint(addr) {
                (StatusCode::OK, "removed\n")
            } else {
                (StatusCode::NOT_FOUND, "not an upstream\n")
            }
        }),
        (_, "/upstreams") => {
            let mut res = reply(StatusCode::METHOD_NOT_ALLOWED, "use GET, POST or DELETE\n");
            let allow = HeaderValue::from_static("GET, POST, DELETE");
            res.headers_mut().insert(header::ALLOW, allow);
            res
        }
        _ => reply(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn list(cluster: &StaticCluster) -> String {
    let endpoints = cluster.endpoints();
    endpoints
        .iter()
        .map(|e| format!("{}\n", e.addr()))
        .collect()
}

/// Applies `change` to the `addr` query parameter, or answers 400 saying what is wrong.
fn with_addr(
    uri: &Uri,
    change: impl FnOnce(SocketAddr) -> (StatusCode, &'static str),
) -> Response<ProxyBody> {
    match addr_param(uri) {
        Ok(addr) => {
            let (status, text) = change(addr);
            info!(upstream.addr = %addr, status = status.as_u16(), "control request");
            reply(status, text)
        }
        Err(reason) => reply(StatusCode::BAD_REQUEST, reason),
    }
}

fn addr_param(uri: &Uri) -> Result<SocketAddr, &'static str> {
    let query = uri.query().unwrap_or_default();
    let value = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("addr="))
        .ok_or("missing ?addr=IP:PORT\n")?;
    match value.parse::<SocketAddr>() {
        Ok(addr) if addr.port() != 0 => Ok(addr),
        Ok(_) => Err("addr needs a port other than 0\n"),
        Err(_) => Err("addr is not IP:PORT\n"),
    }
}

fn reply(status: StatusCode, text: &str) -> Response<ProxyBody> {
    let mut res = Response::new(ProxyBody::full(text.to_owned()));
    *res.status_mut() = status;
    let plain = HeaderValue::from_static("text/plain; charset=utf-8");
    res.headers_mut().insert(header::CONTENT_TYPE, plain);
    res
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    sluice_examples::init_logging();
    // Installed first, so a signal during start-up drains instead of killing the process.
    let stop = os_signal();
    let args = Args::from_env(&["listen", "control", "upstream"])?;
    let listen = args.addr("listen", "127.0.0.1:8080")?;
    let control_addr = args.addr("control", "127.0.0.1:8081")?;
    let mut group = Group::new();
    let names = ["backend-1", "backend-2"];
    let upstreams = upstreams_or_demo(&mut group, args.addrs("upstream")?, &names).await?;

    let opts = StaticOptions {
        lb: LbPolicy::RoundRobin,
        ..StaticOptions::default()
    };
    // The cluster is a handle: the route and the control service share one set of endpoints.
    let cluster = StaticCluster::new("backends", upstreams, opts)?;
    let mut routes = RouteTable::new();
    routes.push(Matcher::any(), Route::to_upstream("all", cluster.clone()));
    let control_service = tower::service_fn(move |req: Request<Incoming>| {
        let res = control(&cluster, &req);
        async move { Ok::<_, Infallible>(res) }
    });

    let proxy = sluice_examples::bind("proxy", listen).await?;
    let control = sluice_examples::bind("control", control_addr).await?;
    group.add(proxy, ProxyService::new(routes), GRACE);
    group.add(control, control_service, GRACE);
    group.run_until(stop).await;
    Ok(())
}
