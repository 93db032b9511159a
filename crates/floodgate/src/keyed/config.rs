//! Plans from TOML text (serde); no file access.

use super::plans::{PlanEntry, Plans, PlansError, PlansFile};
use crate::duration::parse_duration;
use crate::policy::Policy;

/// Parses the `[plans.<name>]` tables of `text` (see [`Plans::from_toml`]).
pub(super) fn parse(text: &str) -> Result<Plans, PlansError> {
    let file: PlansFile = toml::from_str(text).map_err(|e| PlansError::Toml {
        message: e.to_string(),
    })?;
    let mut plans = Plans::new();
    for (name, entry) in &file.plans {
        plans.insert(name, policy(name, entry)?);
    }
    if let Some(default) = &file.default {
        plans.set_default(default)?;
    }
    Ok(plans)
}

fn policy(name: &str, entry: &PlanEntry) -> Result<Policy, PlansError> {
    let period = parse_duration(&entry.period).map_err(|error| PlansError::Period {
        plan: name.to_owned(),
        error,
    })?;
    let policy = Policy::new(entry.limit, period);
    let policy = match entry.burst {
        Some(burst) => policy.and_then(|p| p.with_burst(burst)),
        None => policy,
    };
    policy.map_err(|error| PlansError::Policy {
        plan: name.to_owned(),
        error,
    })
}
