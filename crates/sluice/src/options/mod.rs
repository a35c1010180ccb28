//! The validated configuration turned into the runtime crates' own options: the one place that
//! knows both `sluice-config`'s model and what `sluice-reverse` and `sluice-relay` take, so those crates are used and tested without the TOML model.

pub mod relay;
pub mod reverse;
