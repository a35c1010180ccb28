//! The gRPC call (`ShouldRateLimit`) over a tonic channel, and what its answer means.

use std::sync::OnceLock;

use http::{HeaderName, HeaderValue};
use sluice_config::RateLimitService;
use tonic::transport::{Channel, Endpoint};

use super::proto::{self, Code, RateLimitRequest, RateLimitResponse};
use super::{Descriptor, Failure, Verdict};

/// A route's channel to its service, connected on first use (in the runtime).
pub(super) struct Client {
    endpoint: Option<Endpoint>,
    channel: OnceLock<Channel>,
}

impl Client {
    pub(super) fn new(service: &RateLimitService) -> Self {
        // Validation checked the address; a bad one would fail every call.
        let endpoint = Endpoint::from_shared(format!("http://{}", service.address))
            .ok()
            .map(|e| e.tcp_nodelay(true).connect_timeout(service.timeout));
        Self {
            endpoint,
            channel: OnceLock::new(),
        }
    }

    /// One `ShouldRateLimit` call, bounded by the service's timeout.
    pub(super) async fn ask(
        &self,
        service: &RateLimitService,
        descriptors: Vec<Descriptor>,
    ) -> Result<Verdict, Failure> {
        let Some(endpoint) = &self.endpoint else {
            return Err(Failure::Error(format!(
                "invalid address {}",
                service.address
            )));
        };
        let channel = self.channel.get_or_init(|| endpoint.connect_lazy()).clone();
        let request = RateLimitRequest {
            domain: service.domain.clone(),
            descriptors: descriptors
                .into_iter()
                .map(|d| proto::RateLimitDescriptor {
                    entries: d
                        .into_iter()
                        .map(|(key, value)| proto::Entry { key, value })
                        .collect(),
                })
                .collect(),
            hits_addend: 1,
        };
        let call = call(channel, request, service.timeout);
        match tokio::time::timeout(service.timeout, call).await {
            Err(_) => Err(Failure::Timeout),
            Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
                Err(Failure::Timeout)
            }
            Ok(Err(status)) => Err(Failure::Error(status.to_string())),
            Ok(Ok(response)) => Ok(verdict(response)),
        }
    }
}

async fn call(
    channel: Channel,
    request: RateLimitRequest,
    timeout: std::time::Duration,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(request);
    // `grpc-timeout`: the service may give up on what nobody waits for.
    request.set_timeout(timeout);
    let path = http::uri::PathAndQuery::from_static(proto::SHOULD_RATE_LIMIT);
    let codec = tonic_prost::ProstCodec::default();
    let response = grpc.unary(request, path, codec).await?;
    Ok(response.into_inner())
}

/// The fields of an answer that Sluice writes itself, never copied from the service's.
const OWN_FIELDS: [HeaderName; 7] = [
    http::header::CONNECTION,
    http::header::CONTENT_LENGTH,
    http::header::CONTENT_TYPE,
    http::header::TRANSFER_ENCODING,
    http::header::RETRY_AFTER,
    http::header::DATE,
    http::header::UPGRADE,
];

/// What `response` means: OK, or over the limit with the service's fields and the seconds
/// until a retry may pass (its `Retry-After`, else the longest time until a descriptor over
/// its limit resets, at least 1).
fn verdict(response: RateLimitResponse) -> Verdict {
    if response.overall_code != Code::OverLimit as i32 {
        return Verdict::Ok;
    }
    let mut retry_after = None;
    let mut fields = Vec::new();
    for h in &response.response_headers_to_add {
        let value = match h.raw_value.is_empty() {
            true => h.value.as_bytes(),
            false => &h.raw_value,
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.key.as_bytes()),
            HeaderValue::from_bytes(value),
        ) else {
            continue;
        };
        if name == http::header::RETRY_AFTER {
            retry_after = value.to_str().ok().and_then(|v| v.trim().parse().ok());
        }
        if !OWN_FIELDS.contains(&name) {
            fields.push((name, value));
        }
    }
    let reset = response
        .statuses
        .iter()
        .filter(|s| s.code == Code::OverLimit as i32)
        .filter_map(|s| s.duration_until_reset)
        .map(|d| {
            let whole = u32::try_from(d.seconds.max(0)).unwrap_or(u32::MAX);
            whole.saturating_add(u32::from(d.nanos > 0))
        })
        .max();
    Verdict::OverLimit {
        retry_after: retry_after.or(reset).unwrap_or(1).max(1),
        fields: fields.into_boxed_slice(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn over(statuses: Vec<proto::DescriptorStatus>, headers: Vec<(&str, &str)>) -> Verdict {
        verdict(RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses,
            response_headers_to_add: headers
                .into_iter()
                .map(|(k, v)| proto::HeaderValue {
                    key: k.into(),
                    value: v.into(),
                    raw_value: Vec::new(),
                })
                .collect(),
        })
    }

    fn status(code: Code, seconds: i64, nanos: i32) -> proto::DescriptorStatus {
        proto::DescriptorStatus {
            code: code as i32,
            limit_remaining: 0,
            duration_until_reset: Some(proto::Duration { seconds, nanos }),
        }
    }

    #[test]
    fn retry_after_is_the_longest_reset_of_the_descriptors_over_their_limit() {
        let statuses = vec![
            status(Code::OverLimit, 2, 500),
            status(Code::Ok, 50, 0),
            status(Code::OverLimit, 1, 0),
        ];
        let Verdict::OverLimit { retry_after, .. } = over(statuses, vec![]) else {
            panic!("not over the limit");
        };
        assert_eq!(retry_after, 3);
    }

    #[test]
    fn the_services_fields_are_kept_but_framing_and_its_retry_after_wins() {
        let headers = vec![
            ("x-ratelimit-limit", "50"),
            ("content-length", "0"),
            ("retry-after", "7"),
            ("bad name", "x"),
        ];
        let Verdict::OverLimit {
            retry_after,
            fields,
        } = over(vec![status(Code::OverLimit, 1, 0)], headers)
        else {
            panic!("not over the limit");
        };
        assert_eq!(retry_after, 7);
        let names: Vec<_> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["x-ratelimit-limit"]);
    }

    #[test]
    fn an_answer_not_over_the_limit_lets_the_request_through() {
        for code in [Code::Ok, Code::Unknown] {
            let response = RateLimitResponse {
                overall_code: code as i32,
                ..Default::default()
            };
            assert!(matches!(verdict(response), Verdict::Ok));
        }
    }
}
