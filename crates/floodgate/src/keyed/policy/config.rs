//! Plans from TOML text (serde); no file access. Reaches the plans only through
//! their public face (`Plans::new`, `insert`, `set_default`, `PlansError`): the
//! arrow points from here to `plans`, never back.

use std::collections::BTreeMap;

use super::plans::{Plans, PlansError};
use crate::duration::parse_duration;
use crate::policy::Policy;

impl Plans {
    /// Parses plans from TOML text (no file access: read the file yourself).
    ///
    /// ```toml
    /// default = "free"            # optional; else the first plan
    ///
    /// [plans.free]
    /// limit = 100
    /// period = "1d"               # see floodgate::parse_duration
    /// burst = 10                  # optional; default = limit
    /// ```
    ///
    /// Plans are ordered by name.
    ///
    /// # Errors
    ///
    /// [`PlansError`] naming the plan and field for malformed TOML, a bad duration,
    /// an invalid policy or an unknown default.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::Plans;
    /// let plans = Plans::from_toml(r#"
    ///     default = "free"
    ///     [plans.free]
    ///     limit = 100
    ///     period = "1d"
    ///     burst = 10
    ///     [plans.pro]
    ///     limit = 10000
    ///     period = "1d"
    ///     burst = 100
    /// "#)?;
    /// let classic = Plans::classic();
    /// for name in ["free", "pro"] {
    ///     assert_eq!(plans.policy(plans.id(name).unwrap()), classic.policy(classic.id(name).unwrap()));
    /// }
    /// assert_eq!(plans.name(plans.default_plan().unwrap()), Some("free"));
    /// # Ok::<(), floodgate::keyed::plans::PlansError>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Plans, PlansError> {
        parse(text)
    }
}

/// The TOML shape, parsed with serde.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlansFile {
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    plans: BTreeMap<String, PlanEntry>,
}

/// One `[plans.<name>]` table.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanEntry {
    limit: u64,
    period: String,
    #[serde(default)]
    burst: Option<u64>,
}

/// Parses the `[plans.<name>]` tables of `text` (see [`Plans::from_toml`]).
fn parse(text: &str) -> Result<Plans, PlansError> {
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
