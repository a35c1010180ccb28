//! `[tracing]`: the exporter's endpoint and protocol, sampling, whose context is continued.

use toml::Spanned;

use super::Ctx;
use crate::error::ConfigError;
use crate::model::{OtlpProtocol, TraceExtract, Tracing};
use crate::raw::RawTracing;

/// The most sampled requests whose spans wait for export, by default (the OpenTelemetry SDK's
/// batch queue holds as many spans).
const DEFAULT_QUEUE: usize = 2048;
/// The longest export by default (`OTEL_EXPORTER_OTLP_TIMEOUT`'s default).
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub(crate) fn tracing(ctx: Ctx<'_>, raw: Spanned<RawTracing>) -> Result<Tracing, ConfigError> {
    let raw = raw.into_inner();
    let protocol = match raw.protocol.as_ref().map(|p| (p.get_ref().as_str(), p)) {
        None | Some(("http/protobuf", _)) => OtlpProtocol::HttpProtobuf,
        Some(("grpc", _)) => OtlpProtocol::Grpc,
        Some((other, p)) => {
            let msg = format!("unknown OTLP protocol `{other}`: use \"http/protobuf\" or \"grpc\"");
            return Err(ctx.err(p.span(), msg));
        }
    };
    let endpoint = match &raw.endpoint {
        None => default_endpoint(protocol).to_owned(),
        Some(e) => endpoint(e.get_ref(), protocol).map_err(|msg| ctx.err(e.span(), msg))?,
    };
    let sample_ratio = match &raw.sample_ratio {
        None => 1.0,
        Some(r) if (0.0..=1.0).contains(r.get_ref()) => *r.get_ref(),
        Some(r) => {
            let msg = "`sample_ratio` is a share of the traces, from 0 to 1 (e.g. 0.1)";
            return Err(ctx.err(r.span(), msg));
        }
    };
    let extract = match raw.extract.as_ref().map(|e| (e.get_ref().as_str(), e)) {
        None | Some(("always", _)) => TraceExtract::Always,
        Some(("trusted", _)) => TraceExtract::Trusted,
        Some(("never", _)) => TraceExtract::Never,
        Some((other, e)) => {
            let msg = format!(
                "unknown `extract = \"{other}\"`: use \"always\", \"trusted\" or \"never\""
            );
            return Err(ctx.err(e.span(), msg));
        }
    };
    let service_name = match &raw.service_name {
        None => "sluice".to_owned(),
        Some(n) if n.get_ref().trim().is_empty() => {
            return Err(ctx.err(n.span(), "`service_name` is empty"));
        }
        Some(n) => n.get_ref().clone(),
    };
    let queue = match &raw.queue {
        None => DEFAULT_QUEUE,
        Some(q) if *q.get_ref() == 0 => {
            let msg = "`queue` is how many requests' spans may wait for export: at least 1";
            return Err(ctx.err(q.span(), msg));
        }
        Some(q) => *q.get_ref(),
    };
    Ok(Tracing {
        endpoint,
        protocol,
        sample_ratio,
        parent_based: raw.parent_based.unwrap_or(true),
        extract,
        service_name,
        resource: raw.resource.into_iter().collect(),
        queue,
        timeout: raw.timeout.map_or(DEFAULT_TIMEOUT, |t| t.0),
    })
}

/// A local collector, on the protocol's standard port.
fn default_endpoint(protocol: OtlpProtocol) -> &'static str {
    match protocol {
        OtlpProtocol::HttpProtobuf => "http://127.0.0.1:4318/v1/traces",
        OtlpProtocol::Grpc => "http://127.0.0.1:4317",
    }
}

/// An `http://` URL with a host; for `http/protobuf`, one without a path gets the traces
/// resource's (`/v1/traces`), as `OTEL_EXPORTER_OTLP_ENDPOINT` does.
fn endpoint(text: &str, protocol: OtlpProtocol) -> Result<String, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| format!("`{text}` is not a URL (e.g. \"http://127.0.0.1:4318/v1/traces\")"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err("OTLP over TLS is not built in: export to a collector (or agent) on this host or network over http://".to_owned());
        }
        _ => return Err(format!("`{text}` is not an http:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` names no host"));
    }
    let bare = uri.path() == "/" && !text.ends_with('/');
    Ok(match protocol {
        OtlpProtocol::HttpProtobuf if bare => format!("{text}/v1/traces"),
        _ => text.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_endpoint_without_a_path_gets_the_traces_resource() {
        let http = OtlpProtocol::HttpProtobuf;
        let e = endpoint("http://collector:4318", http);
        assert_eq!(e.as_deref(), Ok("http://collector:4318/v1/traces"));
        let e = endpoint("http://collector:4318/custom/traces", http);
        assert_eq!(e.as_deref(), Ok("http://collector:4318/custom/traces"));
        let e = endpoint("http://collector:4317", OtlpProtocol::Grpc);
        assert_eq!(e.as_deref(), Ok("http://collector:4317"));
    }

    #[test]
    fn endpoints_that_cannot_be_reached_are_refused() {
        for bad in [
            "collector:4318",
            "https://collector:4318",
            "ftp://x",
            "http://",
            "not a url",
        ] {
            assert!(endpoint(bad, OtlpProtocol::HttpProtobuf).is_err(), "{bad}");
        }
    }
}
