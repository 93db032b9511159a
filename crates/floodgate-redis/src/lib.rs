//! # floodgate-redis
//!
//! Distributed rate limiting on Redis with floodgate's semantics: N replicas of a
//! service share one limit instead of each granting its own. GCRA, the fixed window,
//! the sliding window counter and the sliding log run as Lua scripts — each decision
//! is **one script run, one round trip**, atomic on the server, so concurrent callers
//! never lose an update (a client that reads a count and writes it back does: two
//! replicas read 10 and both write 9).
//!
//! ```no_run
//! use floodgate::Policy;
//! use floodgate_redis::{Algorithm, OnFailure, RedisLimiter};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let conn = floodgate_redis::connect("redis://127.0.0.1:6379/").await?;
//! let limiter = RedisLimiter::builder(Algorithm::Gcra, Policy::per_second(100)?)
//!     .prefix("api:")
//!     .timeout(Duration::from_millis(50))
//!     .on_failure(OnFailure::Open)
//!     .build(conn)?;
//!
//! let verdict = limiter.check_n("user:42", 1).await?;
//! if verdict.is_fallback() {
//!     // Redis did not answer in time: admitted by the fail-open policy.
//! }
//! if !verdict.decision().is_allowed() {
//!     // 429, Retry-After: verdict.decision().retry_after_secs()
//! }
//! # Ok(())
//! # }
//! ```
//!
//! ## Semantics
//!
//! The scripts are the in-process transitions ([`floodgate::Gcra`],
//! [`floodgate::FixedWindow`], [`floodgate::SlidingWindow`],
//! [`floodgate::SlidingLog`]) and return the same [`Decision`]: cost 0 reports and
//! is always allowed and writes nothing, a denial writes nothing, a cost above the
//! capacity is denied with `retry_after() == None` ("never"), and a peek writes
//! nothing. The tests replay random traces through Redis and demand decisions equal
//! to [`floodgate::reference`]'s exact models.
//!
//! * **Time** is the server's `TIME`, read inside the script: replicas with skewed
//!   clocks agree. A `TIME` that steps back never moves a state back (GCRA keeps
//!   `max(TAT, now)`, windows never return to an older window of their period, the
//!   log judges an earlier reading at its newest entry; at a policy change, see
//!   below), and a refund never gives back what a
//!   later admission's reading had passed (GCRA: judged no earlier than the key's
//!   latest reading, see **Refunds**).
//! * **Keys** are `prefix + key`, one key per call (Redis Cluster safe). Several
//!   limits on one request ([`RedisLimiterBuilder::and`]: 10 a second *and* 1000 a
//!   day) run in one script, all or nothing, on hash-tagged keys `prefix{key}:i` that
//!   share a Cluster slot. Each write sets a TTL (`PX`/`PEXPIRE`) of the time until
//!   the state is fresh again, rounded up to a millisecond (a window state's may be
//!   longer: a policy change, below, or a Cluster move, whose `MIGRATE` adds the few
//!   milliseconds it took, kept for the rest of that window), so idle keys vanish
//!   and a vanished key decides as a fresh one.
//!   Fixed window, sliding window and GCRA keep one string per key; the sliding log
//!   keeps a sorted set with one member per admitted instant (and, once charged
//!   with a receipt, refund members: **Refunds**, below).
//! * **A policy change** on the same keys (a redeploy): GCRA keeps its TAT and
//!   applies the new interval from now on, as in process; the log judges its
//!   instants by the new period, as long as its key lives (the old period's TTL,
//!   until the next admission sets the new one's). A window state records its
//!   period; one of another period is read on its own windows: each of its counts
//!   holds units admitted before the end of its window, and counts whole in the new
//!   policy's current window while that end is past the window's start (the sliding
//!   window: weighted in the previous window while past that one's start, and no
//!   less in all than the old policy's own estimate then), so the new policy never
//!   counts fewer of those units than its windows hold. A write over a state of
//!   another period keeps the key as long as that period's window (the sliding
//!   window: and the next) may count the units written then, and a later window
//!   write keeps that longer time to live. Unlike in process, where a policy changes
//!   once, a rolling deploy runs both policies on the same keys at once: were a
//!   window of another period to start fresh, a client whose requests alternate
//!   between old and new replicas would reset its count at each switch and never
//!   be limited. One string holds one period's windows, though: a policy that moves
//!   on to its next window drops the units of its last one that a longer window of
//!   the other may still count, and a write on a policy's own state keeps the key
//!   only as long as that policy needs it (or had it). The new policy counts what
//!   the old one's state still holds, nothing more: units a shorter period had
//!   already forgotten (log entries older than its period, windows it moved on
//!   from) do not count, so within the new policy's first period a client may get
//!   its new limit plus those units. A switch read on a clock behind the old
//!   policy's latest admission (a failover to a replica whose `TIME` is behind)
//!   is judged at that admission's reading where the window states record it
//!   ([`RedisLimiterBuilder::latest_reading`], off by default: a version from
//!   before session 49 cannot read the field), so the old units count in the new
//!   period's window of that reading. Without it the switch counts them in the
//!   window of the reading behind (no earlier than the old window's start, which
//!   an admission judged in that window wrote): a window of the new period that ends
//!   before the old one did forgets them when it moves on, though some may have been
//!   admitted in its next window (up to the new limit more within one window). A
//!   longer window too: switched there and back on such a clock, a policy counts
//!   its own units in its window before theirs (the other period's window that held
//!   them started earlier) and forgets them when that one ends. While both run, a
//!   client spread over both may get more than a window's limit within it; keep the
//!   switch-over short. An **algorithm** change needs a prefix of its own: a
//!   script cannot read another algorithm's state, so while the old replicas keep
//!   it alive the new ones get [`RedisLimitError::Redis`] for its keys, and under
//!   [`OnFailure::Open`] admit every request on them.
//!
//! ## Exact arithmetic: microseconds
//!
//! Lua's numbers are doubles, exact only below 2^53. Nanoseconds since the epoch
//! (≈ 1.8·10^18) are not; **microseconds** since the epoch (≈ 1.8·10^15, from
//! `TIME`'s seconds and microseconds) are. The scripts therefore count whole
//! microseconds, and every value they compute stays below 2^53:
//!
//! * the time is at most [`MAX_NOW_MICROS`] = 2^52 µs (the year 2112; a script
//!   refuses a later time with an error);
//! * every span a policy adds to it — GCRA's `B·T`, a window's `2·P`, the log's `P` —
//!   is at most [`MAX_SPAN_MICROS`] = 2^51 µs (≈ 71 years), and the sliding window's
//!   `(L + 1)·P` product is at most 2^53 µs (`L` ≤ 10^5 for a day, ≈ 2.5·10^6 for an
//!   hour, ≈ 9·10^9 for a second).
//!
//! [`RedisLimiterBuilder::build`] rejects a policy beyond these bounds with a
//! [`ConfigError`]. Rounding is always towards denying: GCRA's emission interval
//! `T = ⌈P/L⌉` ns is rounded **up** to whole microseconds (so a rate above 10^6 per
//! second is served as 10^6 per second, and in general the rate error is below
//! 1 µs / T); a window or log period must be a whole number of microseconds
//! ([`ConfigError::PeriodNotWholeMicros`]), since rounding it would move window
//! edges. Reported durations are whole microseconds: the sliding window counter's
//! `retry_after` (which in nanoseconds can fall 1 ns past a bound) is the first whole
//! microsecond at which the request fits, the in-process value rounded up.
//!
//! ## Failures
//!
//! Every call has a timeout (default 50 ms, [`RedisLimiterBuilder::timeout`]). A
//! call that fails or times out is answered by the limiter's [`OnFailure`] policy:
//! fail open (admit), fail closed (deny), or return the [`RedisLimitError`]. A
//! fallback answer is a [`Verdict::Fallback`], never mistaken for Redis's. **A call
//! that timed out may still have charged**: Redis may have run the script and only the
//! reply was late; but no call is charged twice: a request is sent again only when
//! Redis refused it without running it. The connection ([`connect`]) is a
//! multiplexed [`ConnectionManager`] that reconnects by itself, so the limiter
//! recovers without help when Redis comes back. Scripts run with `EVALSHA`; after a
//! `SCRIPT FLUSH` or a restart the client loads the script again and retries
//! (`NOSCRIPT`). A key under the prefix holding what no script writes (another
//! type, a state that does not parse, a time at or past 2^53 µs, a log whose running
//! totals fall) fails the call with a Redis error that names the key as a malformed
//! state, before anything is written.
//!
//! **Out of memory** (`maxmemory` with `noeviction`): Redis refuses a script's
//! first command that may grow memory (`SET`, `ZADD`) only while the script has
//! run no write command (even one that changed nothing), and lets one that has go
//! on to its end, so no call is half written. It fails with `OOM` before any write
//! (a retryable [`RedisLimitError`]) where its first write is such a command:
//! every refund that gives back, and a charge whose first limit writes a GCRA or
//! window state or a fresh log's first refund member. Or it completes on every
//! limit: a charge whose first limit is a sliding log, whose first write trims the
//! members that left the window (`ZREMRANGEBYSCORE`, every log charge but one with
//! a receipt on a fresh key), is decided and written past `maxmemory`, as Redis
//! lets it.
//!
//! ## Redis Cluster
//!
//! [`connect_cluster`] gives a [`ClusterConnection`]; a limiter built on it
//! ([`RedisLimiter<ClusterConnection>`](RedisLimiter)) sends each script run to the
//! node owning its key's slot, follows `MOVED` and `ASK` while slots migrate, and
//! loads the script on every primary after a `NOSCRIPT`. Every call touches one slot:
//! one key, or a multi-limit call's hash-tagged keys. A one-key call keeps deciding
//! while its slot moves. A multi-limit call on a slot in mid-migration runs only
//! where one node holds all of its keys: Redis refuses it unrun (`TRYAGAIN`) while
//! the migration has split them between the two nodes, and while they exist on
//! neither (fresh or expired keys) until the move ends; after its sends (5 at most,
//! 10 ms after each `TRYAGAIN`) the call fails with a retryable
//! [`RedisLimitError`], answered by the failure policy, and nothing is written on
//! either node. Under the default [`OnFailure::Open`] such calls are admitted, so a
//! multi-limit key whose keys are split or new goes unlimited until its slot has
//! moved: where that matters, give a multi-limit limiter [`OnFailure::Closed`] or
//! [`OnFailure::Error`] (and retry a retryable error after a short wait), or
//! reshard at a quiet hour. Finish a move
//! once started rather than abort it: a key left on the importing node when both
//! nodes are set `STABLE` is not read (the owner answers for its slot), so its key
//! decides as a fresh one there — up to a whole limit more — until it is moved back,
//! which Redis refuses (`BUSYKEY`) once the owner has written the key again.
//!
//! ## Local denial cache
//!
//! With [`RedisLimiterBuilder::deny_cache`], a key that Redis denied is denied again
//! in process, without a round trip, until its `retry_after` has passed
//! ([`Verdict::Cached`]): a client hammering past its limit costs Redis one call per
//! wait, not one per request. Only the cost that was denied is answered (a smaller
//! one may fit, and a larger one waits longer than the cached wait); "never" is not
//! cached; the cache holds a bounded number of keys.
//!
//! ## Refunds
//!
//! **Opt-in** ([`RedisLimiterBuilder::refunds`], default off): turn them on once
//! every replica runs a version that reads the refund state (**State**, below).
//! With refunds on, [`RedisLimiter::charge_n`] charges as
//! [`check_n`](RedisLimiter::check_n) does and returns a [`RedisReceipt`];
//! [`RedisLimiter::refund`] gives back what that charge still provably holds, in one
//! script run on the server's time, atomic with every other call on the key.
//! floodgate-http's layer uses them (through [`AsyncLimit::charge_n`] and
//! [`AsyncLimit::refund`]) to give a remote rule's charge back when a later rule
//! denies the request. With refunds off, `charge_n` is a plain `check_n` with no
//! receipt, a refund gives nothing back without a round trip (the layer makes none),
//! and (with [`latest_reading`](RedisLimiterBuilder::latest_reading) off too) every
//! key keeps the plain state that every version reads (GCRA `TAT`, the
//! fixed window `window:count:period`, the sliding window
//! `window:prev:cur:period`, the sliding log exactly its `instant:units:total`
//! members, read with no more round trips than before).
//!
//! * **GCRA** (one limit): the in-process [`floodgate::Gcra`] refund. The charge's
//!   booking, moved down by at most the schedule that refunds made since the charge
//!   gave back (a ledger in the key), is given back as far as it is still ahead of
//!   the server's now; units booked after it that are still ahead of
//!   `now + B·T` stay spent. As in process (session 45; in Redis since session
//!   46), a refund of the schedule's last booking (nothing booked after it) moved
//!   nobody and counts in no later refund's shift while the key remembers it
//!   (the receipts it remembers, **Once**): refunds made latest booking first give every
//!   booking back, in any order of the charges, exactly as the in-process
//!   limiter does. A refund never gives back more than its charge took.
//!   Judged at the later of the server's now and the key's **latest reading** (the
//!   latest server time an admission on the key was judged at, kept in the key
//!   from its first charge with a receipt): a `TIME` that stepped back (a clock
//!   step, a failover to a replica whose clock is behind) gives back only what the
//!   in-process refund gives on a clock in order, never schedule a later
//!   admission had passed (the TAT stays at or above that admission's reading). A
//!   key written before the latest reading was kept (by a version from before it,
//!   **State**, below) has none until its next admission: a refund there is
//!   judged at the server's now as read, exact only while readings come in order
//!   (a `TIME` behind a later admission's reading then gives back up to the
//!   refunded charge's own units more than that admission left, once).
//! * **Fixed window, sliding window** (one limit): the in-process
//!   [`floodgate::FixedWindow`] and [`floodgate::SlidingWindow`] refunds: the
//!   charge's units come off the count of the current window (the sliding window's
//!   `cur`; its previous window's count is never touched) while the key's state is
//!   still the charge's window of this period (at most the cost, never below 0);
//!   once the state has moved on to a later window (or another period's state is
//!   there, a rolling deploy), nothing; nor once another period has written the
//!   key since the charge, even where the state is the charge's window again.
//! * **Once**: a receipt is recorded when its refund gives something back, so sending
//!   it again — a refund whose reply was lost, sent again, or the same receipt from
//!   two replicas at once — gives back nothing more. Each charge notes the key's
//!   refund ledger; a key that forgets a record raises its floor past the
//!   ledger that record's charge noted, and a receipt noted below the floor gives
//!   back nothing (a conservative loss, never a second refund). Charges made
//!   together, before any of their refunds, all note one ledger, so forgetting
//!   one of their records refuses the rest: a key remembers enough for such a
//!   crowd (session 46). A fixed or sliding window remembers the refunds of its
//!   current window, the last 64 (a record of an older window is forgotten
//!   without raising the floor: its receipt gives nothing back in any case); a
//!   GCRA key the last `B` receipts refunded (at least 8, at most 64); a sliding
//!   log forgets, without raising the floor, the record of a receipt whose
//!   instant is before the latest instant a unit was logged at and holds no unit
//!   (no refund takes anything there again), and remembers 8 of the others (the
//!   8 of the latest charges, by the ledger each charge saw; 64 with
//!   [`RedisLimiterBuilder::wide_log_refunds`], once every replica reads them).
//!   So up to 64 charges
//!   of one window, `B` of a GCRA key, and any number of a log charged at
//!   distinct instants, all turned away together, give everything back in any
//!   order; beyond that the first refunds forgotten raise the floor (the rest of
//!   the crowd then gives back nothing). A log's charges at one instant share a
//!   member: their records stay until its last unit is given back, 8 at most
//!   (64 with the wide log option).
//! * A refund that gives something back clears the key's entry in the local denial
//!   cache: the key's next call goes to Redis, which may admit what the refund made
//!   room for (another replica's cache, or another limiter's in this process, keeps
//!   its entry until its wait has passed: the cache is the limiter's own).
//!   So does a refund whose reply never came (a timeout, a lost connection, or a
//!   caller that stopped waiting for it, after Redis may have run it): only a reply
//!   of nothing given back keeps the entry.
//!   A denial of the key sent before the refund's reply came and answered after it
//!   is not cached either (Redis may have decided it before the refund).
//! * **Several limits** ([`RedisLimiterBuilder::and`]): the charge was all or
//!   nothing, and so is its refund: one script run gives back every limit's part by
//!   that limit's rule above (each once, a sliding log's included; a part that gave
//!   nothing, such as a log's judged past its window, may give at a later run,
//!   one judged earlier after the clock stepped back, so the same receipt may
//!   answer `true` twice, each part given back once), after checking
//!   every argument and then reading and checking every limit's state; each key
//!   is read once, and its refund is written from that read. A state
//!   found malformed at any key fails the run with nothing given back on any
//!   limit (only a key written by something else is malformed).
//! * **Sliding log** (session 43): the in-process [`floodgate::SlidingLog`]
//!   refund. The receipt names the instant the charge's units were logged at (with
//!   several charges merged into one member at that instant, its own units): while
//!   that instant is still in the window at the server's now (judged, as every
//!   reading, no earlier than the newest unit logged), the member at it loses the
//!   charge's units (removed when none is left) and **every later member's running
//!   total drops by as many** — `O(members after it)` work in two commands: one
//!   `ZREM` of every member from the charge's instant on and one `ZADD` of those
//!   left (each split per 2 000 members, within what a script may pass one
//!   command), at most `L` members under one policy (every one holds a unit of the
//!   window at the refund's reading; more only while a policy of another period or
//!   limit charges the same key, a rolling deploy), and at most six more commands
//!   for the refund members (and one `ZREM` per record it forgets, **Once**). Its
//!   one read of the members starts at the earliest instant of a record the key
//!   remembers, where that is before the charge's (whether those instants still
//!   hold units decides which records it forgets).
//!   The cost is inherent to the running totals that let a decision read
//!   `O(log² n)` members instead of the window. Once the instant has left the
//!   window, nothing. All of the charge's units or none (units logged at one instant are interchangeable, so
//!   the log left is the one the other charges would have made). A policy of
//!   another period on the key (a rolling deploy) needs no ledger bump here: the
//!   log's instants are exact under any period, a member another period dropped is
//!   gone (its receipts give nothing), and no member comes back at an instant once
//!   dropped (readings are judged no earlier than the latest instant logged).
//! * A receipt names its limiter (the prefix and the limits): another limiter gives
//!   nothing back for it.
//! * **State** (refunds on): a key charged with a receipt holds the refund ledger, a
//!   floor, the key's incarnation and the last receipts after its state — GCRA
//!   `TAT:ledger:latest TAT:floor:incarnation:receipts` (it then expires when the
//!   latest TAT has passed; the receipts begin with its latest reading, written
//!   `0/0/reading`, a form no receipt has, and each receipt whose refund moved no
//!   later booking is followed by a note of it, `0/1/ledger before/given back`,
//!   another), the fixed window
//!   `window:count:period:ledger:floor:incarnation:receipts`, the sliding window
//!   `window:prev:cur:period:ledger:floor:incarnation:receipts` — and every later
//!   write keeps them (a window state's latest reading, where recorded, follows
//!   them: `…:receipts@reading`, [`RedisLimiterBuilder::latest_reading`]). The sliding log's sorted set cannot hold fields beside its
//!   members: it gets more members, all scored `-inf` — a head
//!   `refunds:ledger:floor:incarnation` (from the first charge with a receipt),
//!   `refunds:logged:instant` (once a refund has moved it past 0: the latest
//!   instant a unit was logged at, as far as a refund removed it) and one
//!   `refunds:id:receipt` per receipt the key remembers (at most 8 written, 64
//!   with [`RedisLimiterBuilder::wide_log_refunds`]; up to 64 read since session
//!   47, the first step of a rolling deploy that raises what a key keeps).
//!   Scored `-inf`, they come before every log member, are never the newest member
//!   while a unit is logged and never in a window, so every read of the log members
//!   stays exact (the rank search counts them among the members before the window);
//!   they live and expire with the key, in the key's own slot
//!   (Redis Cluster: no second key, no hash tag needed); a charge keeps them (its
//!   trim of the expired members starts above `-inf`). A companion key would have
//!   needed a hash tag the single-limit key does not have, and could be lost
//!   without the log (or the log without it, and a receipt of the lost log then
//!   refund units of the new one). The incarnation is the server time of the first
//!   charge with a receipt on the key: a key lost and created again (evicted, a
//!   write lost in a failover) gets another, and a receipt of the lost key gives
//!   nothing back on it. Its size: every number in them is below 2^53 (16 digits),
//!   so a refund member is at most 61 bytes (a log member at most 50), within
//!   Redis's default `zset-max-listpack-value` (64): a refunded log stays a
//!   compact listpack — for a log of one unit (`MEMORY USAGE`, Redis 7.0) about
//!   100 bytes without refund members, 130 with the head, 210 after one refund,
//!   500 with 8 receipts remembered, where a skiplist takes about 1 KB — as long
//!   as it holds at most
//!   `zset-max-listpack-entries` members (default 128: the refund members count
//!   among them, at most 10; a log of more instants is a skiplist with or without
//!   refunds — raise that setting if such logs must stay compact).
//!   A version of this crate from before refunds reads such a key as a malformed
//!   state (an error; under [`OnFailure::Open`], an admission): upgrade every
//!   replica first, then turn refunds on. A version from before sliding-log
//!   refunds (session 42) reads a log with its refund members, but fails as
//!   malformed on a log whose every unit was given back (only the refund members
//!   left), its trim drops the refund members (that key's receipts then give
//!   nothing back), and it judges a reading behind a newest unit given back
//!   before that unit's instant (it does not read `logged`): upgrade every replica
//!   of a sliding-log limiter with refunds on before the new version serves it.
//!   A version from before the GCRA latest reading (session 45) reads a GCRA key
//!   that has it (the reading is one of the receipts to it, never a receipt's id)
//!   but keeps it as it found it: its admissions do not raise it, its refunds
//!   are judged at its now as before, and once its own refunds fill the key's 8
//!   receipts it drops the reading (then receipts charged before any refund on
//!   the key give nothing back: a conservative loss), after which the key has
//!   no latest reading until a new version's admission. It drops the reading in
//!   place of a receipt, so while its refunds follow the new version's
//!   admissions the key keeps one receipt more for each; the new version's next
//!   refund trims them back to what it remembers (each receipt trimmed then gives nothing back,
//!   as any charged before the receipts a key remembers). Until every replica runs
//!   the new version a `TIME` that steps back may still free a later admission's
//!   schedule on such keys, as before; no state either version writes is
//!   malformed to the other. A version from before the notes (session 45 and
//!   earlier) reads a GCRA key that has them (each is one of the receipts to it,
//!   never a receipt's id) and keeps them; its refunds write none (they count in
//!   every later shift: less given back, never more), and once its refunds fill
//!   the 8 records it keeps, it drops notes as receipts (its floor then rises to
//!   1 at most for each: receipts charged before any refund give nothing back).
//!   The new version drops a note with its receipt, so a key holds at most 64
//!   receipts (its burst, at least 8) and a note each. The versions before the
//!   crowd records (session 46) remember 8 receipts of every key and read any number: on a key
//!   of more (written by this version) their next refund trims it to 8, raising
//!   the floor (a conservative loss); the sliding log's 8 are unchanged, as those
//!   versions refuse a log of more refund members as malformed. A limiter with refunds off still reads and
//!   keeps these fields where a limiter with them on wrote them.
//!
//! ## Replay
//!
//! [`RedisLimiter::check_n_at_micros`] and [`RedisLimiter::peek_n_at_micros`] (and
//! [`RedisLimiter::charge_n_at_micros`], [`RedisLimiter::refund_at_micros`]) run
//! scripts built from the same transition source that take the time as an
//! argument and set no TTL: for simulation and the conformance tests. The production
//! script never accepts a time from a client.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod deny_cache;
mod error;
mod script;

use core::fmt::Display;
use core::future::Future;
use core::time::Duration;
use std::time::Instant;

use deny_cache::{DenyCache, Ticket};
use floodgate::{AsyncLimit, AsyncReceipt, Decision, Policy};
use redis::aio::{ConnectionLike, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::Script;
use script::{Prologue, Shape};

pub use error::{ConfigError, RedisLimitError};
/// The `redis` crate this one is built on, so that its types ([`redis::RedisError`],
/// which [`connect`] returns; [`redis::aio::ConnectionLike`]) can be named without a
/// dependency of one's own that must match its version.
///
/// # Examples
///
/// ```no_run
/// use floodgate_redis::redis::RedisError;
/// use floodgate_redis::{ClusterConnection, ConnectionManager, RedisLimiter};
///
/// // A service that holds one limiter of each kind names both connections.
/// struct Limits {
///     single: RedisLimiter<ConnectionManager>,
///     cluster: RedisLimiter<ClusterConnection>,
/// }
///
/// async fn connect() -> Result<ConnectionManager, RedisError> {
///     floodgate_redis::connect("redis://127.0.0.1/").await
/// }
/// ```
pub use redis;
/// One Redis server's reconnecting, multiplexed connection ([`connect`]; the
/// default connection of a [`RedisLimiter`]).
pub use redis::aio::ConnectionManager;
/// A Redis Cluster connection ([`connect_cluster`]).
pub use redis::cluster_async::ClusterConnection;

/// The largest span a policy may add to the time, in microseconds: 2^51 µs, about
/// 71 years. See the crate docs on exact arithmetic.
pub const MAX_SPAN_MICROS: u64 = 1 << 51;

/// The latest time the scripts decide at, in microseconds since the epoch: 2^52 µs,
/// in the year 2112.
pub const MAX_NOW_MICROS: u64 = 1 << 52;

/// The largest `(limit + 1) × period` (in microseconds) of a sliding window counter:
/// 2^53, where `prev·(P − e)` and the retry bound stay exact.
pub const MAX_WINDOW_PRODUCT: u64 = 1 << 53;

/// The default per-call timeout: 50 ms.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Which transition the scripts run; the semantics are the in-process algorithm's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// GCRA (token bucket, leaky bucket as a meter): capacity `burst`, one unit per
    /// `T = ⌈period / limit⌉` (rounded up to whole microseconds).
    Gcra,
    /// Fixed window: `limit` per window of `period`, aligned to the Unix epoch.
    FixedWindow,
    /// Sliding window counter: the weighted two-window estimate.
    SlidingWindow,
    /// Sliding log: exact, a sorted set with one member per admitted instant.
    ///
    /// Memory grows with the window's traffic, up to `limit` members (each admitted
    /// microsecond is one), but a decision reads only a few of them: each member
    /// carries the running total of units, so the window's count is two reads and
    /// a denial's wait a binary search, O(log² n) for n members (all n only when
    /// the totals are counted again, past 2^52 units).
    SlidingLog,
}

/// What a limiter answers when Redis does not (an error or a timeout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// Admit ([`Verdict::Fallback`] with an allowed decision, `remaining` 0): the
    /// service stays up while its limiter is down. The default, as most gateways do.
    Open,
    /// Deny ([`Verdict::Fallback`] with a denied decision whose `retry_after` and
    /// `reset_after` are the given wait): protects the service behind the limiter at the cost of
    /// refusing everyone while Redis is down.
    Closed {
        /// The `retry_after` to report.
        retry_after: Duration,
    },
    /// Return the [`RedisLimitError`] for the caller to decide.
    Error,
}

/// A decision, and who made it.
#[derive(Debug)]
#[must_use = "a rate-limit verdict that is not looked at admits everything"]
#[non_exhaustive]
pub enum Verdict {
    /// Redis decided.
    Decided(Decision),
    /// The local denial cache answered with a denial Redis made earlier (see
    /// [`RedisLimiterBuilder::deny_cache`]), aged to now.
    Cached(Decision),
    /// Redis did not answer; the [`OnFailure`] policy decided.
    Fallback {
        /// The fail-open or fail-closed decision.
        decision: Decision,
        /// Why Redis did not decide.
        error: RedisLimitError,
    },
}

impl Verdict {
    /// The decision, whoever made it.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use floodgate_redis::Verdict;
    /// let v = Verdict::Decided(Decision::new(true, 5, 4, Default::default(), None));
    /// assert!(v.decision().is_allowed());
    /// assert!(!v.is_fallback());
    /// ```
    pub fn decision(&self) -> Decision {
        match self {
            Verdict::Decided(d) | Verdict::Cached(d) | Verdict::Fallback { decision: d, .. } => *d,
        }
    }

    /// Whether the failure policy answered instead of Redis.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use floodgate_redis::{RedisLimitError, Verdict};
    /// use std::time::Duration;
    /// let v = Verdict::Fallback {
    ///     decision: Decision::new(true, 5, 0, Duration::ZERO, None),
    ///     error: RedisLimitError::Timeout { after: Duration::from_millis(50) },
    /// };
    /// assert!(v.is_fallback());
    /// ```
    pub fn is_fallback(&self) -> bool {
        matches!(self, Verdict::Fallback { .. })
    }

    /// Whether the local denial cache answered, without a round trip.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use floodgate_redis::Verdict;
    /// let d = Decision::new(false, 5, 0, Default::default(), Some(Default::default()));
    /// assert!(Verdict::Cached(d).is_cached());
    /// ```
    pub fn is_cached(&self) -> bool {
        matches!(self, Verdict::Cached(_))
    }
}

/// A multiplexed connection to `url` that reconnects by itself, tuned for a limiter:
/// a connection attempt gives up after 1 s, and a lost connection is retried after
/// 10, 20, 40 ms (then again on the next call).
///
/// # Errors
///
/// The first connection failed (bad URL, nothing listening).
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> redis::RedisResult<()> {
/// let conn = floodgate_redis::connect("redis://127.0.0.1/").await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> redis::RedisResult<ConnectionManager> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Duration::from_secs(1))
        .set_factor(10)
        .set_exponent_base(2)
        .set_number_of_retries(3)
        .set_max_delay(100);
    ConnectionManager::new_with_config(client, config).await
}

/// A connection to a Redis Cluster through any of its nodes (`seeds`), tuned like
/// [`connect`]: a connection attempt gives up after 1 s.
///
/// The connection learns the cluster's slot map and sends each script run to the
/// node that owns its key's slot. It re-sends no request by itself: one whose
/// connection broke may have run, and a second run would charge the call twice.
/// The limiter sends a script run again only when Redis refused it unrun: it
/// follows `MOVED` (the connection refreshes its map) and `ASK` (`ASKING` on the
/// importing node), so it keeps deciding while slots migrate; it waits out
/// `TRYAGAIN` and `CLUSTERDOWN`; and it loads the script on every primary when one
/// answers `NOSCRIPT`.
///
/// # Errors
///
/// A bad URL, or no seed answered with the cluster's slot map.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use floodgate::Policy;
/// use floodgate_redis::{Algorithm, RedisLimiter};
/// let conn = floodgate_redis::connect_cluster(&[
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
/// ])
/// .await?;
/// let limiter = RedisLimiter::builder(Algorithm::Gcra, Policy::per_second(100)?).build(conn)?;
/// let verdict = limiter.check_n("user:42", 1).await?;
/// # Ok(()) }
/// ```
pub async fn connect_cluster(seeds: &[&str]) -> redis::RedisResult<ClusterConnection> {
    ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(Duration::from_secs(1))
        // The client would re-send a request whose connection broke, which Redis may
        // have run: the limiter re-sends only what Redis refused unrun.
        .retries(0)
        .build()?
        .get_async_connection()
        .await
}

/// Builds a [`RedisLimiter`]: [`RedisLimiter::builder`], then options, then
/// [`build`](RedisLimiterBuilder::build).
#[derive(Clone, Debug)]
#[must_use = "a builder does nothing until built"]
pub struct RedisLimiterBuilder {
    limits: Vec<(Algorithm, Policy)>,
    prefix: String,
    timeout: Duration,
    on_failure: OnFailure,
    deny_cache: usize,
    refunds: bool,
    latest_reading: bool,
    wide_log_refunds: bool,
}

impl RedisLimiterBuilder {
    /// Every key is `prefix + key` (default `"floodgate:"`). It must not contain `{`,
    /// reserved for Redis Cluster hash tags.
    ///
    /// Limiters that share a prefix share state wherever their keys render alike.
    /// Across shapes they never do: a one-limit key that starts with `{` is stored
    /// after a `\`, so no key of a one-limit limiter (`{k}:0`, say) names a limit of a
    /// multi-limit limiter's key. Between limiters of one shape a caller-chosen key
    /// reaches the other's state when both see it: give each limiter with other
    /// policies or other key sources a prefix of its own.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// let b = RedisLimiter::builder(Algorithm::Gcra, floodgate::Policy::per_second(5)?);
    /// assert!(b.prefix("login{").check().is_err());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The most a call waits for Redis (default [`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// What a call answers when Redis does not (default [`OnFailure::Open`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// Keeps up to `keys` recent denials in process (default 0: off). A key that
    /// Redis denied cost `n` with `retry_after` `r` is then denied locally
    /// ([`Verdict::Cached`]), without a round trip, for the same cost `n` until `r`
    /// has passed on the local clock since the request was sent; other costs go to
    /// Redis (a smaller one may fit, a larger one waits longer than `r`). Denials only
    /// get stronger while other callers add traffic, so the cached denial and its
    /// wait are Redis's own (its `remaining` the one Redis reported) as long as nobody
    /// resets the key behind the limiter's back. "Never" is not cached, and neither
    /// is anything once `keys` live denials are held. The bound counts keys, each
    /// held with its name: where callers choose keys, bound their length too.
    pub fn deny_cache(mut self, keys: usize) -> Self {
        self.deny_cache = keys;
        self
    }

    /// Turns remote refunds on (default `false`: off): [`RedisLimiter::charge_n`]
    /// then charges with a receipt that [`RedisLimiter::refund`] gives back (see the
    /// crate docs, "Refunds"), and behind floodgate-http's layer a remote rule's
    /// charge is given back when a later rule denies the request.
    ///
    /// **Turn on once every replica runs a version that reads the refund state.** A
    /// key charged with a receipt stores its state in a longer form (the crate docs,
    /// "Refunds", **State**), which a version of this crate from before refunds reads
    /// as a malformed state: during a rolling deploy, an older replica would fail
    /// every call on such a key (under [`OnFailure::Open`], admit it). With refunds
    /// off, `charge_n` is a plain [`check_n`](RedisLimiter::check_n) whose receipt
    /// gives nothing back, `refund` gives nothing back without a round trip, and no
    /// key leaves the plain form that every version reads. Turning them off again
    /// undoes nothing: a key charged with a receipt keeps the longer form (every write
    /// keeps it) until it expires, so downgrade no replica to a version from before
    /// refunds until then.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// // Every replica reads the refund state: give charges back.
    /// let b = RedisLimiter::builder(Algorithm::Gcra, floodgate::Policy::per_second(5)?)
    ///     .refunds(true);
    /// assert!(b.check().is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn refunds(mut self, on: bool) -> Self {
        self.refunds = on;
        self
    }

    /// Window states record their **latest reading** (default `false`: off): the
    /// fixed and sliding windows keep the server time of the latest admission in the
    /// key (a field after the others, `…@reading`), and judge a call read behind it
    /// (a `TIME` that stepped back, a failover to a replica whose clock is behind)
    /// at that reading, as the sliding log judges no reading earlier than its newest
    /// unit. This closes the over-admission of a policy change read on such a clock
    /// (the crate docs, "A policy change"): the new policy's windows then count the
    /// old units in the window of the latest reading, never in an earlier one that
    /// forgets them sooner. A call judged at a reading later than now answers its
    /// waits (`reset_after`, `retry_after`) and sets its key's time to live from the
    /// server's now, so both are longer by the lag, never shorter. GCRA and the
    /// sliding log need no such field (a TAT and a log's instants carry their own
    /// time) and ignore the option. A key is covered from its first admission by a
    /// limiter with the option on, as long as every replica that writes it has the
    /// option on: one with it off records none of its own admissions on a key that
    /// had no field (a reading behind a state's window is still judged no earlier
    /// than that window's start, with the option or without).
    ///
    /// **Turn on once every replica runs a version that reads the field** (this one,
    /// session 49, or later; a new deployment with no older replica can start with
    /// it on): a version from before it reads a window key that has it as a
    /// malformed state (an error; under [`OnFailure::Open`], an admission).
    /// With the option off, no key gets the field, and a key that has it (written
    /// where the option is on) keeps it on every write (admissions raise it): turning it off
    /// again undoes nothing until such keys expire, so downgrade no replica to a
    /// version from before it until then.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// // Every replica reads the latest reading: judge readings behind it at it.
    /// let b = RedisLimiter::builder(Algorithm::FixedWindow, floodgate::Policy::per_minute(60)?)
    ///     .latest_reading(true);
    /// assert!(b.check().is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn latest_reading(mut self, on: bool) -> Self {
        self.latest_reading = on;
        self
    }

    /// A sliding log keeps up to **64 refund records**, not 8 (default `false`:
    /// off; refunds on, crate docs "Refunds", **Once**): a crowd of up to 64
    /// charges of one key at one instant, all turned away together, then gives
    /// every unit back in any order, where with the option off the refunds after
    /// the 9th give nothing (the floor raised past the crowd's ledger: a
    /// conservative loss, never a second refund). Only the log's refund writes
    /// differently; every other script and key format is unchanged, and a key of
    /// more records is still read by a limiter with the option off (its next
    /// refund there trims them to 8, raising the floor: the same loss).
    ///
    /// **Turn on once every replica runs a version that reads 64 records** (session
    /// 47 or later; a new deployment with no older replica can start with it on):
    /// a version from before it reads a log key of more than 8 records as
    /// malformed (an error; under [`OnFailure::Open`], an admission). Turning it
    /// off again is safe for every version from session 47 on. A log key then
    /// holds up to 66 members at `-inf` beside its units.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// // Every replica reads 64 records: a log's crowd of up to 64 gives all back.
    /// let b = RedisLimiter::builder(Algorithm::SlidingLog, floodgate::Policy::per_minute(60)?)
    ///     .refunds(true)
    ///     .wide_log_refunds(true);
    /// assert!(b.check().is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn wide_log_refunds(mut self, on: bool) -> Self {
        self.wide_log_refunds = on;
        self
    }

    /// Adds a limit on the same keys: a call is admitted only if **every** limit
    /// admits it, and then charges all of them (all or nothing, in one script run).
    ///
    /// With more than one limit, the limits of key `k` are stored under
    /// `prefix{k}:0`, `prefix{k}:1`, … ([`RedisLimiter::redis_keys`]): the hash tag
    /// `{k}` puts them in one Redis Cluster slot, so the one script may touch them
    /// all. The decision reported is the tightest one: when admitted, the limit with
    /// the fewest units remaining; when denied, the denying limit with the longest
    /// wait ("never" above all). That wait is exact: without traffic a limit that
    /// admits now keeps admitting, and each denying limit admits from its own
    /// `retry_after` on.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Policy;
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// // 10 per second, and at most 1000 a day.
    /// let b = RedisLimiter::builder(Algorithm::Gcra, Policy::per_second(10)?)
    ///     .and(Algorithm::FixedWindow, Policy::per_day(1_000)?);
    /// assert!(b.check().is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn and(mut self, algorithm: Algorithm, policy: Policy) -> Self {
        self.limits.push((algorithm, policy));
        self
    }

    /// Validates the configuration without a connection: what
    /// [`build`](RedisLimiterBuilder::build) checks.
    ///
    /// # Errors
    ///
    /// As [`build`](RedisLimiterBuilder::build).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Policy;
    /// use floodgate_redis::{Algorithm, ConfigError, RedisLimiter};
    /// // 10^6 per day in a sliding window: (L + 1)·P exceeds 2^53 µs.
    /// let p = Policy::per_day(1_000_000)?;
    /// let err = RedisLimiter::builder(Algorithm::SlidingWindow, p).check().unwrap_err();
    /// assert!(matches!(err, ConfigError::SpanTooLong { .. }));
    /// assert!(RedisLimiter::builder(Algorithm::Gcra, p).check().is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn check(&self) -> Result<(), ConfigError> {
        self.limits().map(|_| ())
    }

    /// Each limit in script units.
    fn limits(&self) -> Result<Vec<Limit>, ConfigError> {
        if self.prefix.contains('{') {
            return Err(ConfigError::PrefixHasBrace {
                prefix: self.prefix.clone(),
            });
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::ZeroTimeout);
        }
        self.limits
            .iter()
            .map(|&(algorithm, policy)| Limit::new(algorithm, policy))
            .collect()
    }

    /// The limiter on `conn`: a single server's [`ConnectionManager`] ([`connect`]),
    /// a Redis Cluster's [`ClusterConnection`] ([`connect_cluster`]), or any other
    /// cloneable async connection. A clone of one connection may serve many limiters.
    ///
    /// # Errors
    ///
    /// [`ConfigError`]: a prefix with `{`, a zero timeout, or a policy beyond the
    /// exact range (see the crate docs).
    pub fn build<C: Connection>(self, conn: C) -> Result<RedisLimiter<C>, ConfigError> {
        let limits = self.limits()?;
        let shape = match limits.as_slice() {
            [one] => Shape::Single(one.algorithm),
            _ => Shape::Multi,
        };
        let capacity = limits.iter().map(|l| l.capacity).min().unwrap_or(0);
        // Off: no charge script with receipts and no refund script, so `charge_n` is
        // `check_n` and no key ever holds the refund fields.
        let writes = script::Writes {
            readings: self.latest_reading,
            wide_log: self.wide_log_refunds,
        };
        let refunds = |prologue| {
            self.refunds
                .then(|| script::refunds(prologue, writes, shape))
        };
        Ok(RedisLimiter {
            conn,
            capacity,
            limits,
            script: script::server_time(shape, writes),
            replay: script::given_time(shape, writes),
            refunds: refunds(Prologue::Server),
            replay_refunds: refunds(Prologue::Given),
            prefix: self.prefix,
            timeout: self.timeout,
            on_failure: self.on_failure,
            deny_cache: (self.deny_cache > 0).then(|| DenyCache::new(self.deny_cache)),
        })
    }
}

/// One limit in the scripts' units.
#[derive(Clone, Copy, Debug)]
struct Limit {
    algorithm: Algorithm,
    /// GCRA `[T µs, B]`, the others `[P µs, L]`.
    params: [u64; 2],
    /// What its decisions report as the limit (GCRA: burst; others: limit).
    capacity: u64,
}

impl Limit {
    fn new(algorithm: Algorithm, policy: Policy) -> Result<Limit, ConfigError> {
        let too_long = |field, value: u128, max: u64| {
            if value > u128::from(max) {
                Err(ConfigError::SpanTooLong {
                    field,
                    value: u64::try_from(value).unwrap_or(u64::MAX),
                    max,
                })
            } else {
                Ok(())
            }
        };
        if algorithm == Algorithm::Gcra {
            let t = policy.interval_nanos().div_ceil(1_000);
            let b = policy.burst();
            too_long(
                "burst × interval",
                u128::from(b) * u128::from(t),
                MAX_SPAN_MICROS,
            )?;
            return Ok(Limit {
                algorithm,
                params: [t, b],
                capacity: b,
            });
        }
        let period = policy.period_nanos();
        if period % 1_000 != 0 {
            return Err(ConfigError::PeriodNotWholeMicros {
                period: policy.period(),
            });
        }
        let (period, limit) = (period / 1_000, policy.limit());
        too_long("2 × period", 2 * u128::from(period), MAX_SPAN_MICROS)?;
        too_long("limit", u128::from(limit), MAX_SPAN_MICROS)?;
        if algorithm == Algorithm::SlidingWindow {
            too_long(
                "(limit + 1) × period",
                (u128::from(limit) + 1) * u128::from(period),
                MAX_WINDOW_PRODUCT,
            )?;
        }
        Ok(Limit {
            algorithm,
            params: [period, limit],
            capacity: limit,
        })
    }
}

/// What a [`RedisLimiter`] runs its scripts over: a cloneable, shareable async Redis
/// connection. Implemented for every such [`ConnectionLike`], among them
/// [`ConnectionManager`] (one server, [`connect`]) and [`ClusterConnection`] (a Redis
/// Cluster, [`connect_cluster`]).
pub trait Connection: ConnectionLike + Clone + Send + Sync + 'static {}

impl<C: ConnectionLike + Clone + Send + Sync + 'static> Connection for C {}

/// A rate limiter whose state lives in Redis, shared by every process that uses the
/// same keys, prefix and policy.
///
/// `Send + Sync` and cheap to share by reference or `Arc`; calls run concurrently
/// over one multiplexed connection `C`: a single server's [`ConnectionManager`] (the
/// default) or a Redis Cluster's [`ClusterConnection`], which sends each call to the
/// node owning its key. It needs a Tokio runtime with the timer enabled. See the
/// [crate docs](crate) for the semantics, the exact range and the failure policy.
pub struct RedisLimiter<C = ConnectionManager> {
    conn: C,
    limits: Vec<Limit>,
    capacity: u64,
    prefix: String,
    timeout: Duration,
    on_failure: OnFailure,
    deny_cache: Option<DenyCache>,
    script: Script,
    replay: Script,
    /// The charge and refund scripts, server time, where the shape has a refund.
    refunds: Option<(Script, Script)>,
    /// The same on the caller's time (replay).
    replay_refunds: Option<(Script, Script)>,
}

impl<C> core::fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("limits", &self.limits)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("on_failure", &self.on_failure)
            .finish_non_exhaustive()
    }
}

impl RedisLimiter {
    /// A builder for `algorithm` under `policy`, with the defaults: prefix
    /// `"floodgate:"`, timeout [`DEFAULT_TIMEOUT`], [`OnFailure::Open`], no denial
    /// cache, refunds off.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// let b = RedisLimiter::builder(Algorithm::SlidingLog, floodgate::Policy::per_minute(60)?);
    /// assert!(b.check().is_ok());
    /// # Ok::<(), floodgate::PolicyError>(())
    /// ```
    pub fn builder(algorithm: Algorithm, policy: Policy) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            limits: vec![(algorithm, policy)],
            prefix: "floodgate:".to_owned(),
            timeout: DEFAULT_TIMEOUT,
            on_failure: OnFailure::Open,
            deny_cache: 0,
            refunds: false,
            latest_reading: false,
            wide_log_refunds: false,
        }
    }
}

impl<C: Connection> RedisLimiter<C> {
    /// The capacity a fallback decision reports as its limit: the limit's (GCRA:
    /// burst; others: limit), the smallest one's with several limits.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The Redis keys that `key`'s limits are stored under: `prefix + key` for one
    /// limit, with a `\` before a key that starts with `{` or `\` (so that no
    /// one-limit key is ever a multi-limit key); `prefix{key}:i` for limit `i` of
    /// several (see [`RedisLimiterBuilder::and`]), with a `\` before a key that is
    /// empty or starts with `}` or `\` (`prefix{\}:i` for `""`), so that the hash tag
    /// is never empty.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use floodgate::Policy;
    /// use floodgate_redis::{Algorithm, RedisLimiter};
    /// let conn = floodgate_redis::connect("redis://127.0.0.1/").await?;
    /// let two = RedisLimiter::builder(Algorithm::Gcra, Policy::per_second(10)?)
    ///     .and(Algorithm::FixedWindow, Policy::per_day(1_000)?)
    ///     .prefix("api:")
    ///     .build(conn)?;
    /// assert_eq!(two.redis_keys("u7"), ["api:{u7}:0", "api:{u7}:1"]);
    /// # Ok(()) }
    /// ```
    pub fn redis_keys(&self, key: &(impl Display + ?Sized)) -> Vec<String> {
        let n = self.limits.len();
        let key = key.to_string();
        // A `\` before the key where its first characters would collide: a one-limit
        // key that starts with `{` would have the shape of a multi-limit key
        // (`prefix{...`), so a caller-chosen key could reach another limiter's state;
        // a multi-limit key that is empty or starts with `}` would leave the hash tag
        // empty, and Cluster then hashes the whole key. A key that starts with `\`
        // takes one too, so that no two keys meet.
        let escaped = if n == 1 {
            key.starts_with(['{', '\\'])
        } else {
            key.is_empty() || key.starts_with(['}', '\\'])
        };
        let escape = if escaped { "\\" } else { "" };
        if n == 1 {
            return vec![format!("{}{escape}{key}", self.prefix)];
        }
        (0..n)
            .map(|i| format!("{}{{{escape}{key}}}:{i}", self.prefix))
            .collect()
    }

    /// Decides `cost` units for `key` (rendered with `Display` after the prefix) and
    /// consumes them if allowed, in one script run; the failure policy answers when
    /// Redis does not.
    ///
    /// # Errors
    ///
    /// Only under [`OnFailure::Error`]: why Redis did not decide. A call that timed
    /// out may still have charged.
    pub fn check_n<K: Display + ?Sized>(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Verdict, RedisLimitError>> + Send + '_ {
        let keys = self.redis_keys(key);
        async move { self.decide(keys, cost, true).await }
    }

    /// Exactly what [`check_n`](RedisLimiter::check_n) would decide now; writes
    /// nothing.
    ///
    /// # Errors
    ///
    /// As [`check_n`](RedisLimiter::check_n).
    pub fn peek_n<K: Display + ?Sized>(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Verdict, RedisLimitError>> + Send + '_ {
        let keys = self.redis_keys(key);
        async move { self.decide(keys, cost, false).await }
    }

    /// [`check_n`](RedisLimiter::check_n) at a given time (microseconds on the
    /// caller's axis), through the replay script: the same transition, no TTL, no
    /// failure policy. For simulation and tests — never mix it with the server-time
    /// calls on one key.
    ///
    /// # Errors
    ///
    /// [`RedisLimitError`] as Redis reports it, or
    /// [`TimeOutOfRange`](RedisLimitError::TimeOutOfRange) past [`MAX_NOW_MICROS`].
    pub async fn check_n_at_micros<K: Display + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        now_micros: u64,
    ) -> Result<Decision, RedisLimitError> {
        let keys = self.redis_keys(key);
        self.run(&self.replay, keys, cost, true, Some(now_micros))
            .await
    }

    /// [`peek_n`](RedisLimiter::peek_n) at a given time, as
    /// [`check_n_at_micros`](RedisLimiter::check_n_at_micros).
    ///
    /// # Errors
    ///
    /// As [`check_n_at_micros`](RedisLimiter::check_n_at_micros).
    pub async fn peek_n_at_micros<K: Display + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        now_micros: u64,
    ) -> Result<Decision, RedisLimitError> {
        let keys = self.redis_keys(key);
        self.run(&self.replay, keys, cost, false, Some(now_micros))
            .await
    }

    /// [`check_n`](RedisLimiter::check_n), with a receipt that
    /// [`refund`](RedisLimiter::refund) can give back: `Some` for an admission of
    /// cost ≥ 1 that Redis decided on a limiter with refunds turned on
    /// ([`RedisLimiterBuilder::refunds`]; every algorithm and several limits);
    /// `None` for a denial, a cost of 0, a cached or fallback verdict, and on a
    /// limiter with refunds off (see the crate docs, "Refunds"), whose charge is a
    /// plain [`check_n`](RedisLimiter::check_n).
    ///
    /// # Errors
    ///
    /// As [`check_n`](RedisLimiter::check_n).
    pub fn charge_n<K: Display + ?Sized>(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<(Verdict, Option<RedisReceipt>), RedisLimitError>> + Send + '_
    {
        let keys = self.redis_keys(key);
        async move {
            let Some((charge, _)) = &self.refunds else {
                return self.decide(keys, cost, true).await.map(|v| (v, None));
            };
            let sent = Instant::now();
            let pending = match self.cached(&keys, cost, sent) {
                Ok(d) => return Ok((Verdict::Cached(d), None)),
                Err(pending) => pending,
            };
            let outcome = self.charge_with_receipt(charge, keys, cost, None).await;
            if let (Some((cache, key, ticket)), Ok((d, _))) = (pending, &outcome) {
                cache.record(&key, cost, sent, ticket, *d);
            }
            match outcome {
                Ok((d, receipt)) => Ok((Verdict::Decided(d), receipt)),
                Err(e) => self.verdict(Err(e)).map(|v| (v, None)),
            }
        }
    }

    /// Gives back what the charge behind `receipt` still provably holds, in one
    /// script run on the server's time: GCRA gives back the part of the charge's
    /// booking still ahead of the server's now, less what units booked after it
    /// still hold, as the in-process [`floodgate::Gcra`] refund does; the windows and
    /// the sliding log give back the charge's units while they still count (the
    /// crate docs, "Refunds"). Returns
    /// whether anything came back: `false`, without a round trip, on a limiter with
    /// refunds off ([`RedisLimiterBuilder::refunds`]).
    ///
    /// Safe to send again (after a timeout, from another replica): the server
    /// records each refund by its receipt and gives a charge back at most once. It
    /// remembers the refunds of a key up to a bound (a window's 64 of its current
    /// window, GCRA's `B` between 8 and 64, a log's 8 besides those that can give
    /// nothing back again: the crate docs, "Refunds", **Once**); a receipt charged
    /// before all of them gives back nothing (a conservative loss).
    ///
    /// # Errors
    ///
    /// Why Redis did not answer (a timeout, a lost connection: the refund may then
    /// have been made or not), whatever the failure policy: a refund has no
    /// fallback.
    pub async fn refund(&self, receipt: &RedisReceipt) -> Result<bool, RedisLimitError> {
        self.refund_on(self.refunds.as_ref(), receipt, None).await
    }

    /// [`charge_n`](RedisLimiter::charge_n) at a given time, as
    /// [`check_n_at_micros`](RedisLimiter::check_n_at_micros): for simulation and
    /// tests.
    ///
    /// # Errors
    ///
    /// As [`check_n_at_micros`](RedisLimiter::check_n_at_micros).
    pub async fn charge_n_at_micros<K: Display + ?Sized>(
        &self,
        key: &K,
        cost: u32,
        now_micros: u64,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        let keys = self.redis_keys(key);
        let Some((charge, _)) = &self.replay_refunds else {
            return self
                .run(&self.replay, keys, cost, true, Some(now_micros))
                .await
                .map(|d| (d, None));
        };
        self.charge_with_receipt(charge, keys, cost, Some(now_micros))
            .await
    }

    /// One run of a charge script that returns receipts: the decision (several
    /// limits: the tightest), and the receipt of every limit that wrote one.
    async fn charge_with_receipt(
        &self,
        script: &Script,
        keys: Vec<String>,
        cost: u32,
        now_micros: Option<u64>,
    ) -> Result<(Decision, Option<RedisReceipt>), RedisLimitError> {
        // Several limits: `write` 2 asks the multi-limit script for the receipts.
        let mode = if self.limits.len() == 1 { 1 } else { 2 };
        let reply = self
            .send_script(script, keys.clone(), cost, mode, now_micros)
            .await?;
        let cached_as = keys.first().cloned().unwrap_or_default();
        let each = match self.limits.len() {
            1 => vec![script::charged(&reply)?],
            n => script::charged_each(&reply, n)?,
        };
        let decisions: Vec<Decision> = each.iter().map(|(d, _)| *d).collect();
        let decision = tightest(&decisions).ok_or_else(|| RedisLimitError::MalformedReply {
            detail: "no decision".to_owned(),
        })?;
        let parts: Vec<ReceiptPart> = each
            .into_iter()
            .zip(keys)
            .enumerate()
            .filter_map(|(limit, ((_, proof), key))| {
                Some(ReceiptPart {
                    limit,
                    key,
                    algorithm: self.limits.get(limit)?.algorithm,
                    proof: proof?,
                })
            })
            .collect();
        let receipt = (decision.is_allowed() && !parts.is_empty()).then(|| RedisReceipt {
            issuer: self.issuer(),
            parts,
            cached_as,
        });
        Ok((decision, receipt))
    }

    /// [`refund`](RedisLimiter::refund) at a given time, as
    /// [`check_n_at_micros`](RedisLimiter::check_n_at_micros).
    ///
    /// # Errors
    ///
    /// As [`check_n_at_micros`](RedisLimiter::check_n_at_micros).
    pub async fn refund_at_micros(
        &self,
        receipt: &RedisReceipt,
        now_micros: u64,
    ) -> Result<bool, RedisLimitError> {
        self.refund_on(self.replay_refunds.as_ref(), receipt, Some(now_micros))
            .await
    }

    /// What a receipt names its issuer by: the prefix and the limits.
    fn issuer(&self) -> (String, Vec<(Algorithm, [u64; 2])>) {
        let limits = self
            .limits
            .iter()
            .map(|l| (l.algorithm, l.params))
            .collect();
        (self.prefix.clone(), limits)
    }

    /// One refund script run under the timeout.
    async fn refund_on(
        &self,
        scripts: Option<&(Script, Script)>,
        receipt: &RedisReceipt,
        now_micros: Option<u64>,
    ) -> Result<bool, RedisLimitError> {
        let Some((_, refund)) = scripts else {
            return Ok(false);
        };
        if receipt.issuer != self.issuer() {
            return Ok(false);
        }
        // Each part must be of one of this limiter's limits, as it charged.
        let limits: Option<Vec<&Limit>> = receipt
            .parts
            .iter()
            .map(|part| {
                self.limits
                    .get(part.limit)
                    .filter(|l| l.algorithm == part.algorithm)
            })
            .collect();
        let Some(limits) = limits.filter(|l| !l.is_empty()) else {
            return Ok(false);
        };
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(refund.get_hash()).arg(receipt.parts.len());
        for part in &receipt.parts {
            evalsha.arg(&part.key);
        }
        if let Some(now) = now_micros {
            if now > MAX_NOW_MICROS {
                return Err(RedisLimitError::TimeOutOfRange { now_micros: now });
            }
            evalsha.arg(now);
        }
        let several = self.limits.len() > 1;
        for (part, limit) in receipt.parts.iter().zip(limits) {
            if several {
                evalsha.arg(script::code(limit.algorithm));
            }
            evalsha.arg(&part.proof[..]).arg(limit.params[0]);
            if limit.algorithm == Algorithm::Gcra {
                evalsha.arg(limit.params[1]);
            }
        }
        // What was given back may admit a cost the cache remembers denied: the
        // next call asks Redis. So may a refund whose reply was lost (a timeout
        // after Redis ran it, a dropped connection, a caller that stopped waiting:
        // this future dropped, the guard's drop forgets): only a reply of nothing
        // given back keeps the entry.
        let mut forget = ForgetOnDrop {
            cache: self.deny_cache.as_ref(),
            key: &receipt.cached_as,
        };
        let gave = self.send_timed(refund, &evalsha).await.and_then(|reply| {
            if several {
                script::given_back_each(&reply).map(|backs| backs.iter().any(|&b| b > 0))
            } else {
                script::given_back(&reply).map(|back| back > 0)
            }
        });
        if matches!(gave, Ok(false)) {
            forget.cache = None;
        }
        drop(forget);
        gave
    }

    /// A production decision: the denial cache, else one script run, under the
    /// failure policy.
    async fn decide(
        &self,
        keys: Vec<String>,
        cost: u32,
        write: bool,
    ) -> Result<Verdict, RedisLimitError> {
        let sent = Instant::now();
        let pending = match self.cached(&keys, cost, sent) {
            Ok(d) => return Ok(Verdict::Cached(d)),
            Err(pending) => pending,
        };
        let outcome = self.run(&self.script, keys, cost, write, None).await;
        if let (Some((cache, key, ticket)), Ok(d)) = (pending, &outcome) {
            cache.record(&key, cost, sent, ticket, *d);
        }
        self.verdict(outcome)
    }

    /// The denial cache's answer for a call on `keys` sent at `sent`; else where
    /// Redis's answer is to be recorded, and with what ticket (none with the cache
    /// off).
    fn cached(
        &self,
        keys: &[String],
        cost: u32,
        sent: Instant,
    ) -> Result<Decision, Option<(&DenyCache, String, Ticket)>> {
        let (Some(cache), Some(first)) = (&self.deny_cache, keys.first()) else {
            return Err(None);
        };
        cache
            .lookup(first, cost, sent)
            .map_err(|ticket| Some((cache, first.clone(), ticket)))
    }

    /// The SHA1 that the production script runs under (`EVALSHA`): for monitoring
    /// (`SCRIPT EXISTS`) or to load-test the script alone with `redis-benchmark`.
    pub fn script_sha1(&self) -> &str {
        self.script.get_hash()
    }

    /// How many keys the local denial cache holds now (0 when it is off).
    pub fn cached_denials(&self) -> usize {
        self.deny_cache.as_ref().map_or(0, DenyCache::len)
    }

    /// One script run under the timeout, its reply a decision.
    async fn run(
        &self,
        script: &Script,
        keys: Vec<String>,
        cost: u32,
        write: bool,
        now_micros: Option<u64>,
    ) -> Result<Decision, RedisLimitError> {
        let reply = self
            .send_script(script, keys, cost, u8::from(write), now_micros)
            .await?;
        match self.limits.len() {
            1 => script::decision(&reply),
            n => tightest(&script::decisions(&reply, n)?).ok_or_else(|| {
                RedisLimitError::MalformedReply {
                    detail: "no decision".to_owned(),
                }
            }),
        }
    }

    /// One run of a deciding script under the timeout: its reply. `write`: 0 a
    /// peek, 1 a check, 2 a multi-limit check that returns receipts.
    async fn send_script(
        &self,
        script: &Script,
        keys: Vec<String>,
        cost: u32,
        write: u8,
        now_micros: Option<u64>,
    ) -> Result<redis::Value, RedisLimitError> {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash()).arg(keys.len()).arg(keys);
        if let Some(now) = now_micros {
            if now > MAX_NOW_MICROS {
                return Err(RedisLimitError::TimeOutOfRange { now_micros: now });
            }
            evalsha.arg(now);
        }
        evalsha.arg(cost).arg(write);
        match self.limits.as_slice() {
            [one] => {
                evalsha.arg(one.params[0]).arg(one.params[1]);
            }
            several => {
                for l in several {
                    evalsha
                        .arg(script::code(l.algorithm))
                        .arg(l.params[0])
                        .arg(l.params[1]);
                }
            }
        }
        self.send_timed(script, &evalsha).await
    }

    /// `evalsha` of `script`, sent until Redis runs it, under the timeout.
    async fn send_timed(
        &self,
        script: &Script,
        evalsha: &redis::Cmd,
    ) -> Result<redis::Value, RedisLimitError> {
        let mut conn = self.conn.clone();
        let sent = script::send(&mut conn, script, evalsha);
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(RedisLimitError::Timeout {
                after: self.timeout,
            }),
        }
    }

    /// A script's outcome under the failure policy.
    fn verdict(
        &self,
        outcome: Result<Decision, RedisLimitError>,
    ) -> Result<Verdict, RedisLimitError> {
        let error = match outcome {
            Ok(d) => return Ok(Verdict::Decided(d)),
            Err(e) => e,
        };
        let decision = match self.on_failure {
            OnFailure::Open => Decision::new(true, self.capacity, 0, Duration::ZERO, None),
            // Full again no sooner than it admits: a client that schedules by the
            // reset (`X-RateLimit-Reset`, `RateLimit`'s `t`) waits as long as one
            // that reads `retry_after`.
            OnFailure::Closed { retry_after } => {
                Decision::new(false, self.capacity, 0, retry_after, Some(retry_after))
            }
            OnFailure::Error => return Err(error),
        };
        Ok(Verdict::Fallback { decision, error })
    }
}

/// Forgets `key`'s cached denial when dropped, unless `cache` was taken away: a
/// refund in flight forgets it however its future ends (a reply, an error, or
/// dropped by its caller after Redis may have run it).
struct ForgetOnDrop<'a> {
    cache: Option<&'a DenyCache>,
    key: &'a str,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(cache) = self.cache {
            cache.forget(self.key);
        }
    }
}

/// The decision of several limits on one request: when all admit, the one with the
/// fewest units remaining; else the denying one with the longest wait, "never"
/// (`None`) above any wait. The first wins a tie. `None` for no decisions.
fn tightest(decisions: &[Decision]) -> Option<Decision> {
    if decisions.iter().all(Decision::is_allowed) {
        return decisions.iter().copied().reduce(|best, d| {
            if d.remaining() < best.remaining() {
                d
            } else {
                best
            }
        });
    }
    // Never (None) waits longest: u64::MAX.
    let wait = |d: &Decision| d.retry_after_nanos().unwrap_or(u64::MAX);
    decisions
        .iter()
        .copied()
        .filter(|d| !d.is_allowed())
        .reduce(|best, d| if wait(&d) > wait(&best) { d } else { best })
}

/// Proof of one charge in Redis ([`RedisLimiter::charge_n`]), for
/// [`RedisLimiter::refund`]: the key, the charge's booking and the refund ledger it
/// saw, all as the server wrote them.
///
/// It may be sent more than once (a refund whose reply was lost, sent again; two
/// replicas refunding the same charge): the server records each refund by its
/// receipt and gives a charge back once, whoever sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisReceipt {
    /// The issuing limiter's prefix and limits: a limiter of another prefix or other
    /// limits gives nothing back for it.
    issuer: (String, Vec<(Algorithm, [u64; 2])>),
    /// One per limit that charged with a receipt (every limit of a multi-limit
    /// charge).
    parts: Vec<ReceiptPart>,
    /// The key the local denial cache knows the charged key by (its first Redis
    /// key): a refund that gives something back, or whose reply was lost, forgets
    /// its cached denial.
    cached_as: String,
}

/// What one limit's charge took.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ReceiptPart {
    /// The limit's index in the limiter.
    limit: usize,
    key: String,
    /// The algorithm that charged: another's refund gives nothing for it.
    algorithm: Algorithm,
    /// What the charge script returned for its refund (GCRA: the booking's start
    /// and end and the ledger, in microseconds; the windows: the window, the
    /// current count after the charge, the ledger and the cost; the sliding log:
    /// the instant, the cost, the running total after the charge and the ledger;
    /// then the key's incarnation).
    proof: Vec<u64>,
}

/// The limiter behind floodgate's async limit trait, so a layer written for the
/// in-process limiters (HTTP) runs on Redis unchanged.
///
/// A key is any `Display` type (`str`, `String`, integers, `IpAddr`, a user's own
/// key type): Redis keys are strings, so a key is rendered once, after the prefix.
/// Two keys that render alike share a limit. The [`OnFailure`] policy applies: under
/// `Open` and `Closed` the fallback comes back as `Ok` (use
/// [`RedisLimiter::check_n`] to tell it apart), under `Error` as `Err`.
///
/// Behind floodgate-http's layer, a fallback that comes back as `Ok` is a decision
/// like Redis's: `Open` admits (counted as allowed) and `Closed` answers 429 with its
/// wait, whatever the layer's (or the rule's) `OnLimiterError` says, and the layer
/// counts no error. Build with [`OnFailure::Error`] for the layer to decide (fail
/// closed with 503, or skip the rule) and count each failure in the rule's `errors`.
/// A key type without `Display`, such as the layer's `Global` extractor's `()`, is no
/// key here: give a global rule a constant key (`from_fn(|_| Ok("all"))`).
///
/// A limiter with refunds turned on ([`RedisLimiterBuilder::refunds`];
/// [`RedisLimiter::charge_n`], [`RedisLimiter::refund`]; every algorithm and
/// several limits) refunds: behind the layer, its charge is given back when a later
/// rule denies the request. With refunds off (the default) it keeps the trait's
/// defaults: a plain check, an empty receipt, no refund and no round trip for one.
impl<K: Display + ?Sized, C: Connection> AsyncLimit<K> for RedisLimiter<C> {
    type Error = RedisLimitError;

    fn check_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, RedisLimitError>> + Send {
        let verdict = RedisLimiter::check_n(self, key, cost);
        async move { verdict.await.map(|v| v.decision()) }
    }

    fn peek_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<Decision, RedisLimitError>> + Send {
        let verdict = RedisLimiter::peek_n(self, key, cost);
        async move { verdict.await.map(|v| v.decision()) }
    }

    /// [`RedisLimiter::charge_n`]: the receipt holds a [`RedisReceipt`] when Redis
    /// charged with one.
    fn charge_n(
        &self,
        key: &K,
        cost: u32,
    ) -> impl Future<Output = Result<(Decision, AsyncReceipt), RedisLimitError>> + Send {
        let charged = RedisLimiter::charge_n(self, key, cost);
        async move {
            let (verdict, receipt) = charged.await?;
            let receipt = receipt.map_or_else(AsyncReceipt::none, AsyncReceipt::new);
            Ok((verdict.decision(), receipt))
        }
    }

    /// [`RedisLimiter::refund`] of the receipt's [`RedisReceipt`]; a receipt without
    /// one, or of another key, gives back nothing. The key must be the one charged:
    /// the receipt names its Redis key, and a refund for another gives nothing.
    fn refund(
        &self,
        key: &K,
        receipt: AsyncReceipt,
    ) -> impl Future<Output = Result<bool, RedisLimitError>> + Send {
        let keys = self.redis_keys(key);
        let proof = receipt.into_inner::<RedisReceipt>().filter(|r| {
            r.parts
                .iter()
                .all(|part| keys.get(part.limit) == Some(&part.key))
        });
        async move {
            match proof {
                Some(r) => RedisLimiter::refund(self, &r).await,
                None => Ok(false),
            }
        }
    }
}

/// Compile-time proof that the limiter and its answers cross threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RedisLimiter>();
    assert_send_sync::<RedisLimiter<ClusterConnection>>();
    assert_send_sync::<Verdict>();
    assert_send_sync::<RedisLimitError>();
};

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(remaining: u64) -> Decision {
        Decision::new(true, 10, remaining, Duration::ZERO, None)
    }

    fn deny(retry: Option<u64>) -> Decision {
        Decision::new(false, 10, 0, Duration::ZERO, retry.map(Duration::from_secs))
    }

    #[test]
    fn the_tightest_decision_of_several_limits() {
        assert_eq!(tightest(&[]), None);
        assert_eq!(tightest(&[allow(5), allow(2), allow(7)]), Some(allow(2)));
        assert_eq!(
            tightest(&[allow(5), deny(Some(3)), deny(Some(9)), deny(Some(1))]),
            Some(deny(Some(9)))
        );
        assert_eq!(
            tightest(&[deny(Some(3)), deny(None), allow(1)]),
            Some(deny(None))
        );
    }

    #[test]
    fn each_limit_is_checked_and_the_prefix_may_not_open_a_hash_tag() {
        let ok = Policy::per_second(10).unwrap();
        let b = RedisLimiter::builder(Algorithm::Gcra, ok);
        assert!(b.clone().check().is_ok());
        let bad = Policy::new(3, Duration::from_nanos(3_000_500)).unwrap();
        assert_eq!(
            b.clone().and(Algorithm::SlidingLog, bad).check(),
            Err(ConfigError::PeriodNotWholeMicros {
                period: Duration::from_nanos(3_000_500)
            })
        );
        assert_eq!(
            b.clone().prefix("a{b").check(),
            Err(ConfigError::PrefixHasBrace {
                prefix: "a{b".to_owned()
            })
        );
        assert_eq!(
            b.timeout(Duration::ZERO).check(),
            Err(ConfigError::ZeroTimeout)
        );
    }

    #[test]
    fn spans_beyond_the_exact_range_are_refused() {
        // GCRA: B·T = 2^51 µs fits, one more unit of burst does not.
        let t_us = 1_u64 << 20;
        let p = Policy::new(1, Duration::from_micros(t_us)).unwrap();
        let b =
            |burst| RedisLimiter::builder(Algorithm::Gcra, p.with_burst(burst).unwrap()).check();
        assert!(b(1 << 31).is_ok());
        assert!(matches!(
            b((1 << 31) + 1),
            Err(ConfigError::SpanTooLong {
                field: "burst × interval",
                ..
            })
        ));
        // Windows: 2·P ≤ 2^51 µs.
        let w = |us| {
            RedisLimiter::builder(
                Algorithm::FixedWindow,
                Policy::new(1, Duration::from_micros(us)).unwrap(),
            )
            .check()
        };
        assert!(w(1 << 50).is_ok());
        assert!(w((1 << 50) + 1).is_err());
        // The sliding window: (L + 1)·P ≤ 2^53 µs.
        let s = |limit, us| {
            RedisLimiter::builder(
                Algorithm::SlidingWindow,
                Policy::new(limit, Duration::from_micros(us)).unwrap(),
            )
            .check()
        };
        assert!(s((1 << 23) - 1, 1 << 30).is_ok());
        assert!(matches!(
            s(1 << 23, 1 << 30),
            Err(ConfigError::SpanTooLong {
                field: "(limit + 1) × period",
                ..
            })
        ));
    }
}
