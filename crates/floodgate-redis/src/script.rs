//! The Lua scripts and their replies.
//!
//! Each algorithm is one transition function (`lua/*.lua`) after the shared helpers
//! (`lua/common.lua`). A script is a prologue, the helpers, the transitions it needs
//! and a driver: one transition on `KEYS[1]`, or every limit of a multi-limit call
//! all or nothing (`lua/multi.lua`). Two prologues:
//!
//! * **server time** (production): `now` from Redis `TIME`, keys get a TTL. This
//!   script reads no time from its arguments.
//! * **given time** (replay and tests): `now` is the first argument and keys get no
//!   TTL (the replayed clock is not the server's, so a TTL would expire keys at the
//!   wrong moment).

use core::any::Any;
use core::time::Duration;

use floodgate::Decision;
use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, RedisResult, Script, Value};

use crate::error::RedisLimitError;
use crate::Algorithm;

const COMMON: &str = include_str!("lua/common.lua");
const GCRA: &str = include_str!("lua/gcra.lua");
const FIXED_WINDOW: &str = include_str!("lua/fixed_window.lua");
const SLIDING_WINDOW: &str = include_str!("lua/sliding_window.lua");
const SLIDING_LOG: &str = include_str!("lua/sliding_log.lua");
const MULTI: &str = include_str!("lua/multi.lua");
const MULTI_REFUND: &str = include_str!("lua/multi_refund.lua");

/// Server time: `TIME` (seconds, microseconds) as microseconds since the epoch,
/// about 1.8·10^15 in 2026 and exact in a double until 2^53 µs (the year 2255).
/// `redis.replicate_commands()` lets Redis 3.2 to 4 replicate a script that writes
/// after reading `TIME` (effects replication); since 5 it is the default and the call
/// a no-op, so it is made only where the function exists.
const SERVER_TIME: &str = "\
if redis.replicate_commands then redis.replicate_commands() end
local EXPIRE = true
local ARG = ARGV
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
";

/// Given time: `ARGV[1]` is `now` in microseconds; the transition's arguments follow.
const GIVEN_TIME: &str = "\
local EXPIRE = false
local ARG = {}
for i = 2, #ARGV do ARG[i - 1] = ARGV[i] end
local now = tonumber(ARGV[1])
";

/// What the scripts write that a version before a rolling deploy's last step cannot
/// read: the builder's options that are off until every replica reads them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Writes {
    /// Window states record their latest reading (the builder's
    /// [`latest_reading`](crate::RedisLimiterBuilder::latest_reading); `READINGS`
    /// in `lua/common.lua`).
    pub(crate) readings: bool,
    /// A sliding log keeps up to 64 refund records, not 8 (the builder's
    /// [`wide_log_refunds`](crate::RedisLimiterBuilder::wide_log_refunds);
    /// `WIDE_LOG` in `lua/sliding_log.lua`).
    pub(crate) wide_log: bool,
}

impl Writes {
    /// The lines after the prologue that set them.
    fn lua(self) -> String {
        format!(
            "local READINGS = {}\nlocal WIDE_LOG = {}\n",
            self.readings, self.wide_log
        )
    }
}

fn transition(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => GCRA,
        Algorithm::FixedWindow => FIXED_WINDOW,
        Algorithm::SlidingWindow => SLIDING_WINDOW,
        Algorithm::SlidingLog => SLIDING_LOG,
    }
}

/// The driver of a one-limit script: the transition on `KEYS[1]` with the arguments
/// cost, write, and its two parameters.
fn single(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => SINGLE_GCRA,
        Algorithm::FixedWindow => SINGLE_FIXED_WINDOW,
        Algorithm::SlidingWindow => SINGLE_SLIDING_WINDOW,
        Algorithm::SlidingLog => SINGLE_SLIDING_LOG,
    }
}

macro_rules! single_driver {
    ($name:ident, $function:literal) => {
        const $name: &str = concat!(
            "return ",
            $function,
            "(KEYS[1], tonumber(ARG[1]), ARG[2] == '1', tonumber(ARG[3]), tonumber(ARG[4]))\n"
        );
    };
}
single_driver!(SINGLE_GCRA, "gcra");
single_driver!(SINGLE_FIXED_WINDOW, "fixed_window");
single_driver!(SINGLE_SLIDING_WINDOW, "sliding_window");
single_driver!(SINGLE_SLIDING_LOG, "sliding_log");

/// The algorithm's number in the multi-limit driver.
pub(crate) fn code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::Gcra => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::SlidingWindow => 3,
        Algorithm::SlidingLog => 4,
    }
}

/// What a script computes: one algorithm on one key, or several limits at once.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Shape {
    Single(Algorithm),
    Multi,
}

fn source(prologue: &str, writes: Writes, shape: Shape) -> String {
    match shape {
        Shape::Single(a) => [prologue, &writes.lua(), COMMON, transition(a), single(a)].concat(),
        Shape::Multi => every_transition(prologue, writes, MULTI),
    }
}

/// A multi-limit script: the prologue, the helpers, every transition (and its
/// refund), then `driver`.
fn every_transition(prologue: &str, writes: Writes, driver: &str) -> String {
    [
        prologue,
        &writes.lua(),
        COMMON,
        GCRA,
        FIXED_WINDOW,
        SLIDING_WINDOW,
        SLIDING_LOG,
        driver,
    ]
    .concat()
}

/// The production script: time from the server, writing as `writes` says.
pub(crate) fn server_time(shape: Shape, writes: Writes) -> Script {
    Script::new(&source(SERVER_TIME, writes, shape))
}

/// The replay script: the same transitions, time from the caller.
pub(crate) fn given_time(shape: Shape, writes: Writes) -> Script {
    Script::new(&source(GIVEN_TIME, writes, shape))
}

/// The driver of a charge with a receipt: the one-limit driver's transition, then
/// the receipt's numbers (`RECEIPT`, set by a transition that wrote) after the
/// reply's five fields.
macro_rules! charge_driver {
    ($name:ident, $function:literal) => {
        const $name: &str = concat!(
            "ISSUING = true\n",
            "local r = ",
            $function,
            "(KEYS[1], tonumber(ARG[1]), ARG[2] == '1', tonumber(ARG[3]), tonumber(ARG[4]))\n",
            "if r.err or not RECEIPT then return r end\n",
            "for i = 1, #RECEIPT do r[5 + i] = RECEIPT[i] end\n",
            "return r\n"
        );
    };
}
charge_driver!(CHARGE_GCRA, "gcra");
charge_driver!(CHARGE_FIXED_WINDOW, "fixed_window");
charge_driver!(CHARGE_SLIDING_WINDOW, "sliding_window");
charge_driver!(CHARGE_SLIDING_LOG, "sliding_log");

/// The driver of a refund: `$args` whole numbers below 2^53 (the receipt's, then
/// the limit's parameters) passed to the refund function, which reads and checks
/// the key and returns what it gives back with the function that writes it.
macro_rules! refund_driver {
    ($name:ident, $function:literal, $args:literal) => {
        const $name: &str = concat!(
            "local a = {}\n",
            "for i = 1, ",
            $args,
            " do\n",
            "  a[i] = tonumber(ARG[i])\n",
            "  if not a[i] or a[i] < 0 or a[i] >= EXACT or a[i] ~= math.floor(a[i]) then\n",
            "    return redis.error_reply('floodgate: refund argument ' .. i .. ' is not a whole number below 2^53')\n",
            "  end\n",
            "end\n",
            "local back, write = ",
            $function,
            "(KEYS[1], unpack(a))\n",
            "if write then write() end\n",
            "return back\n"
        );
    };
}
// GCRA: start, end, ledger, incarnation; T, B.
refund_driver!(REFUND_GCRA, "gcra_refund", "6");
// Fixed window: window, count after, ledger, cost, incarnation; P (the limit L is
// not needed).
refund_driver!(REFUND_FIXED_WINDOW, "fixed_window_refund", "6");
// Sliding window: window, current count after, ledger, cost, incarnation; P.
refund_driver!(REFUND_SLIDING_WINDOW, "sliding_window_refund", "6");
// Sliding log: instant, cost, running total after, ledger, incarnation; P.
refund_driver!(REFUND_SLIDING_LOG, "sliding_log_refund", "6");

/// The scripts that charge with a receipt and refund it, for every algorithm (GCRA,
/// the fixed and sliding windows, the sliding log) and for several limits (the
/// multi-limit script, whose charges return receipts when `write` is 2, and a
/// refund of every limit in one run).
pub(crate) fn refunds(prologue: Prologue, writes: Writes, shape: Shape) -> (Script, Script) {
    let prologue = match prologue {
        Prologue::Server => SERVER_TIME,
        Prologue::Given => GIVEN_TIME,
    };
    let (transition, charge, refund) = match shape {
        Shape::Multi => {
            return (
                Script::new(&source(prologue, writes, shape)),
                Script::new(&every_transition(prologue, writes, MULTI_REFUND)),
            );
        }
        Shape::Single(Algorithm::Gcra) => (GCRA, CHARGE_GCRA, REFUND_GCRA),
        Shape::Single(Algorithm::FixedWindow) => {
            (FIXED_WINDOW, CHARGE_FIXED_WINDOW, REFUND_FIXED_WINDOW)
        }
        Shape::Single(Algorithm::SlidingWindow) => {
            (SLIDING_WINDOW, CHARGE_SLIDING_WINDOW, REFUND_SLIDING_WINDOW)
        }
        Shape::Single(Algorithm::SlidingLog) => {
            (SLIDING_LOG, CHARGE_SLIDING_LOG, REFUND_SLIDING_LOG)
        }
    };
    let with =
        |driver| Script::new(&[prologue, &writes.lua(), COMMON, transition, driver].concat());
    (with(charge), with(refund))
}

/// Where a script's time comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Prologue {
    /// The server's `TIME`.
    Server,
    /// The first argument.
    Given,
}

/// One limit's charge: the decision, and the receipt's numbers when it wrote.
pub(crate) type Charged = (Decision, Option<Vec<u64>>);

/// A charge's reply: the decision, and the receipt's numbers when it wrote.
pub(crate) fn charged(reply: &Value) -> Result<Charged, RedisLimitError> {
    let malformed = |detail: &str| RedisLimitError::MalformedReply {
        detail: format!("{detail}: {reply:?}"),
    };
    match reply {
        Value::Array(items) if items.len() > 5 => {
            let d = decision(&Value::Array(items[..5].to_vec()))?;
            let receipt = items[5..]
                .iter()
                .map(|item| match item {
                    Value::Int(i) => u64::try_from(*i).map_err(|_| malformed("a negative receipt")),
                    _ => Err(malformed("a receipt field is not an integer")),
                })
                .collect::<Result<Vec<u64>, _>>()?;
            if !d.is_allowed() {
                return Err(malformed("a receipt for a denial"));
            }
            Ok((d, Some(receipt)))
        }
        _ => Ok((decision(reply)?, None)),
    }
}

/// A multi-limit charge's reply: each limit's decision, and its receipt's numbers
/// when it wrote one.
pub(crate) fn charged_each(reply: &Value, limits: usize) -> Result<Vec<Charged>, RedisLimitError> {
    match reply {
        Value::Array(items) if items.len() == limits => items.iter().map(charged).collect(),
        _ => Err(RedisLimitError::MalformedReply {
            detail: format!("not {limits} decisions: {reply:?}"),
        }),
    }
}

/// A multi-limit refund's reply: what each limit gave back.
pub(crate) fn given_back_each(reply: &Value) -> Result<Vec<u64>, RedisLimitError> {
    match reply {
        Value::Array(items) => items.iter().map(given_back).collect(),
        _ => Err(RedisLimitError::MalformedReply {
            detail: format!("not a multi-limit refund: {reply:?}"),
        }),
    }
}

/// A refund's reply: what it gave back (GCRA: microseconds of schedule).
pub(crate) fn given_back(reply: &Value) -> Result<u64, RedisLimitError> {
    match reply {
        Value::Int(i) => u64::try_from(*i).map_err(|_| RedisLimitError::MalformedReply {
            detail: format!("a negative refund: {reply:?}"),
        }),
        _ => Err(RedisLimitError::MalformedReply {
            detail: format!("not a refund: {reply:?}"),
        }),
    }
}

/// The most times one script run is sent: the first, then once per refusal.
const SENDS: usize = 5;

/// The wait before sending again to a Cluster slot that is not ready.
const NOT_READY_WAIT: Duration = Duration::from_millis(10);

/// Sends `evalsha` (a script's `EVALSHA` with its keys and arguments) until Redis
/// runs it or fails it.
///
/// Only a request that Redis refused **without running it** is sent again: for a
/// script it lacks (`NOSCRIPT`: the script is loaded — on every primary of a
/// Cluster — and run), a Cluster slot that moved (`MOVED`: the connection refreshes
/// its slot map first), a slot in mid-migration (`ASK`: sent to the importing node
/// after `ASKING`, in one pipeline) or one not ready (`TRYAGAIN`, `CLUSTERDOWN`),
/// and a request never sent (no connection to the slot's node). Nothing else is: a
/// request whose connection broke may have run, and a second run would charge the
/// call again.
pub(crate) async fn send<C>(conn: &mut C, script: &Script, evalsha: &Cmd) -> RedisResult<Value>
where
    C: ConnectionLike + Send + 'static,
{
    let mut ask: Option<String> = None;
    let mut sent = 0;
    loop {
        sent += 1;
        let reply = match &ask {
            None => evalsha.query_async(conn).await,
            Some(node) => asking(conn, node, evalsha).await,
        };
        let error = match reply {
            Ok(value) => return Ok(value),
            Err(error) if sent >= SENDS => return Err(error),
            Err(error) => error,
        };
        match error.kind() {
            ErrorKind::NoScriptError => {
                script.load_async(conn).await?;
            }
            ErrorKind::Moved => ask = None,
            ErrorKind::Ask => match error.redirect_node() {
                Some((node, _slot)) => ask = Some(node.to_owned()),
                None => return Err(error),
            },
            ErrorKind::TryAgain | ErrorKind::ClusterDown | ErrorKind::ClusterConnectionNotFound => {
                ask = None;
                tokio::time::sleep(NOT_READY_WAIT).await;
            }
            _ => return Err(error),
        }
    }
}

/// `ASKING` and `evalsha` in one pipeline to the Cluster node `node` (`host:port`),
/// which is importing the slot.
async fn asking<C: 'static>(conn: &mut C, node: &str, evalsha: &Cmd) -> RedisResult<Value> {
    let refused = |detail: String| {
        redis::RedisError::from((ErrorKind::ClientError, "cannot follow ASK", detail))
    };
    let Some(cluster) = (conn as &mut dyn Any).downcast_mut::<ClusterConnection>() else {
        return Err(refused("not a Redis Cluster connection".to_owned()));
    };
    let Some((host, port)) = node
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host, port.parse().ok()?)))
    else {
        return Err(refused(format!("no port in {node:?}")));
    };
    let route = SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    };
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(evalsha.clone());
    let mut replies = cluster.route_pipeline(&pipe, 1, 1, route).await?;
    match replies.pop() {
        Some(reply) => reply.extract_error(),
        None => Err(refused(format!("no reply from {node}"))),
    }
}

/// A multi-limit script's reply: one decision per limit, in order.
pub(crate) fn decisions(reply: &Value, limits: usize) -> Result<Vec<Decision>, RedisLimitError> {
    match reply {
        Value::Array(items) if items.len() == limits => items.iter().map(decision).collect(),
        _ => Err(RedisLimitError::MalformedReply {
            detail: format!("not {limits} decisions: {reply:?}"),
        }),
    }
}

/// A script's reply `{allowed, limit, remaining, reset_after_us, retry_after_us}`
/// (`retry_after_us` −1 for never) as a [`Decision`]; anything else is
/// [`RedisLimitError::MalformedReply`].
pub(crate) fn decision(reply: &Value) -> Result<Decision, RedisLimitError> {
    let malformed = |detail: &str| RedisLimitError::MalformedReply {
        detail: format!("{detail}: {reply:?}"),
    };
    let Value::Array(items) = reply else {
        return Err(malformed("not an array"));
    };
    let mut ints = [0_i64; 5];
    if items.len() != ints.len() {
        return Err(malformed("not five fields"));
    }
    for (slot, item) in ints.iter_mut().zip(items) {
        match item {
            Value::Int(i) => *slot = *i,
            _ => return Err(malformed("a field is not an integer")),
        }
    }
    let [allowed, limit, remaining, reset, retry] = ints;
    let unsigned = |x: i64| u64::try_from(x).map_err(|_| malformed("a negative field"));
    let allowed = match allowed {
        0 => false,
        1 => true,
        _ => return Err(malformed("allowed is not 0 or 1")),
    };
    let retry = match retry {
        -1 => None,
        r => Some(micros(unsigned(r)?)),
    };
    Ok(Decision::new(
        allowed,
        unsigned(limit)?,
        unsigned(remaining)?,
        micros(unsigned(reset)?),
        retry,
    ))
}

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_replies_become_decisions() {
        let r = Value::Array(vec![
            Value::Int(0),
            Value::Int(5),
            Value::Int(2),
            Value::Int(1_500),
            Value::Int(-1),
        ]);
        let d = decision(&r).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.limit(), 5);
        assert_eq!(d.remaining(), 2);
        assert_eq!(d.reset_after(), Duration::from_micros(1_500));
        assert_eq!(d.retry_after(), None);
    }

    #[test]
    fn malformed_replies_are_typed_errors() {
        let bad = [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![Value::Int(1); 4]),
            Value::Array(vec![Value::Int(2); 5]),
            Value::Array(vec![Value::Nil; 5]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5),
                Value::Int(-2),
                Value::Int(0),
                Value::Int(0),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5),
                Value::Int(0),
                Value::Int(0),
                Value::Int(-7),
            ]),
        ];
        for reply in bad {
            assert!(
                matches!(
                    decision(&reply),
                    Err(RedisLimitError::MalformedReply { .. })
                ),
                "{reply:?}"
            );
        }
    }

    #[test]
    fn both_scripts_share_the_transition_and_only_the_replay_reads_a_time_argument() {
        for a in [
            Algorithm::Gcra,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let body = [
                COMMON,
                transition(a),
                single(a),
                MULTI,
                CHARGE_GCRA,
                REFUND_GCRA,
                CHARGE_FIXED_WINDOW,
                REFUND_FIXED_WINDOW,
                CHARGE_SLIDING_WINDOW,
                REFUND_SLIDING_WINDOW,
                CHARGE_SLIDING_LOG,
                REFUND_SLIDING_LOG,
                MULTI_REFUND,
            ]
            .concat();
            assert!(
                !body.contains("ARGV"),
                "{a:?} must read its arguments as ARG"
            );
            assert!(
                !body.contains("TIME"),
                "{a:?} must take now from the prologue"
            );
            let s = Shape::Single(a);
            let plain = Writes::default();
            assert_ne!(
                server_time(s, plain).get_hash(),
                given_time(s, plain).get_hash()
            );
            // Each option is its own script (a replica's SHA1 names what it writes).
            for option in [
                Writes {
                    readings: true,
                    ..plain
                },
                Writes {
                    wide_log: true,
                    ..plain
                },
            ] {
                assert_ne!(
                    server_time(s, plain).get_hash(),
                    server_time(s, option).get_hash()
                );
            }
        }
        assert!(!SERVER_TIME.contains("ARGV["));
    }
}
