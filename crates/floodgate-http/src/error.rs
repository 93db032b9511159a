//! Configuration errors: each names the field and the bad value.

use core::fmt;

/// A layer, rule or extractor configuration that cannot be used.
///
/// # Examples
///
/// ```
/// let err = floodgate_http::PolicyName::new("").unwrap_err();
/// assert_eq!(err.to_string(), r#"policy name "": it is empty"#);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A policy (rule) name that cannot be written as a Structured Field string.
    PolicyName {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Two rules with the same name: their header members could not be told apart.
    DuplicateRule {
        /// The repeated name.
        name: String,
    },
    /// A trusted network that does not parse as `ADDR` or `ADDR/PREFIX`.
    Network {
        /// The text as given.
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A header name that HTTP does not allow.
    HeaderName {
        /// The name as given.
        name: String,
    },
    /// A prefix length longer than the address (32 for IPv4, 128 for IPv6).
    Prefix {
        /// Which prefix (`"ipv4"`, `"ipv6"`).
        family: &'static str,
        /// The length given.
        len: u8,
    },
    /// A priority rule with no tiers (its `bounds` list is empty).
    Tiers {
        /// The rule's name.
        name: String,
    },
    /// A never-fits status that is not a client or server error (4xx or 5xx): a
    /// request the layer refused would look answered, or redirected, or (1xx, 204,
    /// 304) could not carry the body that explains the refusal.
    NeverStatus {
        /// The status given.
        status: u16,
    },
    /// A key extractor's length bound that no key fits under (`0`): every request
    /// would lose its key, and a hard rule would answer each one `400`.
    MaxLen {
        /// Which bound (`"HeaderKey::max_len"`, `"RoutePath::max_len"`,
        /// `"ForwardedIp::max_len"`).
        field: &'static str,
        /// The bound given.
        max_len: usize,
    },
    /// A rule whose cost is more than its limiter ever admits at once (a GCRA burst,
    /// a window's limit) for any key: every request would be refused as one that can
    /// never fit.
    Cost {
        /// The rule's name.
        rule: String,
        /// The cost given ([`Rule::cost`](crate::Rule::cost)).
        cost: u32,
        /// The most units its limiter admits at once.
        capacity: u64,
    },
    /// A rule on a plan limiter (`floodgate::keyed::plans::PlanLimiter`) whose cost
    /// is more than every one of its plans ever admits at once (each plan's GCRA
    /// burst, its window's limit): no user of any plan could ever pass. The plan of
    /// the largest capacity is named
    /// ([`Charge::never_fits_plan`](crate::Charge::never_fits_plan)). Raise that
    /// plan's capacity to at least the cost, or lower the rule's cost. A cost above
    /// only some plans' capacities is not refused: those plans' users are answered
    /// the never-fits status ("not on your plan").
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::keyed::plans::{PlanLimiter, Plans};
    /// use floodgate::KeyedBuilder;
    /// use floodgate_http::{ConfigError, HeaderKey, RateLimitLayer, Rule};
    /// let plans = Plans::classic(); // bursts: free 10, pro 100, enterprise 1 000
    /// let pro = plans.id("pro").unwrap();
    /// let per_key = PlanLimiter::<String, _>::new(&plans, move |_: &String| pro, KeyedBuilder::default())?;
    /// let err = RateLimitLayer::builder()
    ///     .rule(Rule::new("exports", per_key, HeaderKey::new("x-api-key")?)?.cost(5_000))
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(
    ///     err,
    ///     ConfigError::PlanCost { rule: "exports".into(), plan: "enterprise".into(), cost: 5_000, capacity: 1_000 }
    /// );
    /// assert_eq!(
    ///     err.to_string(),
    ///     r#"rule "exports": cost 5000 is more than the 1000 units plan "enterprise" admits at once, and no plan admits more, so no request could ever pass; raise the plan's burst (a window plan's limit) to at least 5000, or lower the rule's cost"#
    /// );
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    PlanCost {
        /// The rule's name.
        rule: String,
        /// The plan's name (of the largest capacity: the one that comes closest).
        plan: String,
        /// The cost given ([`Rule::cost`](crate::Rule::cost)).
        cost: u32,
        /// The most units that plan admits at once.
        capacity: u64,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::PolicyName { name, reason } => {
                write!(f, "policy name {name:?}: {reason}")
            }
            ConfigError::DuplicateRule { name } => {
                write!(f, "two rules are named {name:?}; rule names must be unique")
            }
            ConfigError::Network { text, reason } => {
                write!(f, "trusted network {text:?}: {reason}")
            }
            ConfigError::HeaderName { name } => {
                write!(f, "header name {name:?} is not a valid HTTP field name")
            }
            ConfigError::Prefix { family, len } => {
                let max = if *family == "ipv4" { 32 } else { 128 };
                write!(f, "{family} prefix /{len} is longer than /{max}")
            }
            ConfigError::Tiers { name } => {
                write!(
                    f,
                    "priority rule {name:?}: bounds is empty; give one per tier"
                )
            }
            ConfigError::NeverStatus { status } => {
                write!(
                    f,
                    "never-fits status {status} is not a client or server error (4xx or 5xx)"
                )
            }
            ConfigError::MaxLen { field, max_len } => {
                write!(
                    f,
                    "{field} {max_len}: no key fits in {max_len} bytes, so every request would lose its key"
                )
            }
            ConfigError::Cost {
                rule,
                cost,
                capacity,
            } => {
                write!(
                    f,
                    "rule {rule:?}: cost {cost} is more than the {capacity} units its limiter admits at once, so no request could ever pass"
                )
            }
            ConfigError::PlanCost {
                rule,
                plan,
                cost,
                capacity,
            } => {
                write!(
                    f,
                    "rule {rule:?}: cost {cost} is more than the {capacity} units plan {plan:?} admits at once, and no plan admits more, so no request could ever pass; raise the plan's burst (a window plan's limit) to at least {cost}, or lower the rule's cost"
                )
            }
        }
    }
}

impl std::error::Error for ConfigError {}
