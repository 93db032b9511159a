//! The policy features, built on the keyed limiter's face: per-key plans
//! ([`plans`], and their TOML loader), composite limits ([`composite`]) and the
//! per-key hot-key mode ([`hot`]). Imports point down to the limiter and its
//! storage, never the reverse; `config` reaches `plans` and never the reverse.
//! Their paths are `floodgate::keyed::{plans, composite, hot}`.

pub mod composite;
#[cfg(feature = "serde")]
mod config;
pub mod hot;
pub mod plans;
