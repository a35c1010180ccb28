//! The validated configuration turned into the runtime crates' own options: the one place that
//! knows both `sluice-config`'s model and what `sluice-reverse` takes, so
//! that crate is used and tested without the TOML model.

pub mod reverse;
