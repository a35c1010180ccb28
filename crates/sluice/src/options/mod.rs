//! The validated configuration turned into the runtime crates' own options: the one place that
//! knows both `sluice-config`'s model and what `sluice-server`, `sluice-reverse` and
//! `sluice-relay` take, so those crates are used and tested without the TOML model.

pub mod relay;
pub mod reverse;

use sluice_server::HttpOptions;

/// A listener's `http` settings as the transport takes them.
pub fn http(config: &sluice_config::HttpOptions) -> HttpOptions {
    let sluice_config::HttpOptions {
        http2,
        fast_path,
        request_header_timeout,
        client_body_timeout,
        idle_timeout,
        max_header_bytes,
        max_request_body,
        max_requests_per_connection,
        max_connections_per_client,
        trusted_proxies,
        rules,
    } = config.clone();
    HttpOptions {
        http2,
        fast_path,
        request_header_timeout,
        client_body_timeout,
        idle_timeout,
        max_header_bytes,
        max_request_body,
        max_requests_per_connection,
        max_connections_per_client,
        trusted_proxies,
        rules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server bound in code (`Server::bind`) speaks HTTP as a configured listener that says
    /// nothing of `http`.
    #[test]
    fn the_transports_defaults_are_the_configurations() {
        let text = "[[listener]]\nname = \"l\"\nlisten = \"127.0.0.1:0\"\n\
                    [[route]]\ndirect_response = { status = 204 }\n";
        let config = sluice_config::parse_str(text, "t.toml", std::path::Path::new("."));
        let config = config.expect("parses");
        assert_eq!(http(&config.listeners[0].http), HttpOptions::default());
    }
}
