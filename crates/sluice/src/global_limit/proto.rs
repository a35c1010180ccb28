//! The messages of Envoy's rate-limit service API v3 (`envoy.service.ratelimit.v3`) that
//! Sluice sends and reads: the fields it uses, with the tags of Envoy's `.proto` files, as
//! prost-build generates them (the `envoy-types` crate's output, cut to these). Protobuf
//! decoders skip fields they do not know, so a service's answer with the rest decodes.
//! The whole generated crate (4 MB of Rust, every Envoy API) would add minutes to every
//! build for five messages.

/// `envoy.service.ratelimit.v3.RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub(super) domain: String,
    #[prost(message, repeated, tag = "2")]
    pub(super) descriptors: Vec<RateLimitDescriptor>,
    #[prost(uint32, tag = "3")]
    pub(super) hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub(super) entries: Vec<Entry>,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct Entry {
    #[prost(string, tag = "1")]
    pub(super) key: String,
    #[prost(string, tag = "2")]
    pub(super) value: String,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct RateLimitResponse {
    #[prost(enumeration = "Code", tag = "1")]
    pub(super) overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub(super) statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub(super) response_headers_to_add: Vec<HeaderValue>,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct DescriptorStatus {
    #[prost(enumeration = "Code", tag = "1")]
    pub(super) code: i32,
    #[prost(uint32, tag = "3")]
    pub(super) limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub(super) duration_until_reset: Option<Duration>,
}

/// `envoy.service.ratelimit.v3.RateLimitResponse.Code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub(super) enum Code {
    Unknown = 0,
    Ok = 1,
    OverLimit = 2,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct HeaderValue {
    #[prost(string, tag = "1")]
    pub(super) key: String,
    #[prost(string, tag = "2")]
    pub(super) value: String,
    #[prost(bytes = "vec", tag = "3")]
    pub(super) raw_value: Vec<u8>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub(super) struct Duration {
    #[prost(int64, tag = "1")]
    pub(super) seconds: i64,
    #[prost(int32, tag = "2")]
    pub(super) nanos: i32,
}

/// The method's path.
pub(super) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
