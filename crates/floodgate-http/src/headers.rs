//! Rendering a [`Decision`] as HTTP header fields: the legacy `X-RateLimit-*` trio,
//! the IETF `RateLimit-Policy` / `RateLimit` fields and `Retry-After`.
//!
//! Every function here is pure (the clock for the epoch form of `X-RateLimit-Reset`
//! is a parameter), so the exact strings are unit-tested.
//!
//! # The IETF fields
//!
//! Pinned to **draft-ietf-httpapi-ratelimit-headers-10** (27 September 2025): both
//! fields are Structured Field Lists (RFC 9651) with one member per policy; a member
//! is an sf-string (the policy name) with integer parameters:
//!
//! ```text
//! RateLimit-Policy: "per-ip";q=10;w=60, "global";q=1000;w=1
//! RateLimit: "per-ip";r=3;t=42, "global";r=998;t=1
//! ```
//!
//! * `q` — the quota: [`Decision::limit`] (GCRA: the burst `B`);
//! * `w` — the window in whole seconds, at least 1 (GCRA: `⌈B·T⌉`, see
//!   [`window_secs`]); omitted when the rule does not know it;
//! * `r` — [`Decision::remaining`]; `t` — [`Decision::reset_after_secs`] (rounded up);
//! * `pk` — only when configured: an sf-binary holding a keyed hash of the partition
//!   key ([`PartitionKeyHasher`]), never the key itself.
//!
//! Integers are clamped to the Structured Field range (at most [`MAX_SF_INTEGER`]).
//!
//! Later revisions of the draft exist; the field syntax above is the one -10 defines,
//! and a change of revision is a change of this module.
//!
//! # Cost
//!
//! The layer writes a response's fields one after another into one stack buffer
//! (`ResponseFields`): integers by hand, names quoted and escaped once (when the
//! [`PolicyName`] is made), no `format!`, no `String`. The buffer then becomes one
//! shared byte string and every field value is a slice of it: **one allocation per
//! response** for all the fields, while they fit the buffer's 256 bytes (the legacy
//! trio and the IETF members of a few rules with short names). Past that, the values
//! spill to a heap buffer that grows and is then shared: two or three allocations
//! (twelve rules named in 25 bytes each take three), still not one per field.
//! Nothing is shared with other requests (a value cached across requests would be a
//! reference count written by every thread).
//!
//! With the service's fields kept (`HeaderOptions::keep_service_fields`, opt-in), a
//! List field the service also wrote takes one more allocation for the combined
//! value, and its lines are parsed as RFC 9651 Lists (a linear scan, with a list of
//! members per line and a buffer per display string to check its UTF-8).

use core::fmt;
use core::hash::Hash;
use core::ops::Range;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use floodgate::{Decision, Policy};
use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use crate::error::ConfigError;

/// The largest Structured Field integer (RFC 9651 §3.3.1: at most 15 digits).
pub const MAX_SF_INTEGER: u64 = 999_999_999_999_999;

/// The longest policy name accepted, in bytes.
pub const MAX_POLICY_NAME_LEN: usize = 64;

/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset`.
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `X-RateLimit-Exceeded`: the soft rules a request went over (it was let through).
pub static X_RATELIMIT_EXCEEDED: HeaderName = HeaderName::from_static("x-ratelimit-exceeded");
/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// A policy name, checked once at configuration time: 1 to [`MAX_POLICY_NAME_LEN`]
/// bytes of printable ASCII (`0x20..=0x7E`), the characters an sf-string may hold.
/// `"` and `\` are allowed and escaped when rendered.
///
/// # Examples
///
/// ```
/// use floodgate_http::PolicyName;
/// assert_eq!(PolicyName::new("per-ip")?.as_str(), "per-ip");
/// assert!(PolicyName::new("").is_err());
/// assert!(PolicyName::new("naïve").is_err());
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PolicyName {
    name: Box<str>,
    /// The name as an sf-string (quoted, `"` and `\` escaped), rendered once.
    sf_string: Box<str>,
}

impl PolicyName {
    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::PolicyName`] when it is empty, longer than
    /// [`MAX_POLICY_NAME_LEN`], or holds a byte outside `0x20..=0x7E`.
    pub fn new(name: &str) -> Result<PolicyName, ConfigError> {
        let bad = |reason: &'static str| ConfigError::PolicyName {
            name: name.to_owned(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > MAX_POLICY_NAME_LEN {
            return Err(bad("it is longer than 64 bytes"));
        }
        if !name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(bad(
                "an sf-string holds only printable ASCII (0x20..=0x7E): no control characters, no non-ASCII",
            ));
        }
        let mut sf_string = String::with_capacity(name.len() + 2);
        sf_string.push('"');
        for c in name.chars() {
            if c == '"' || c == '\\' {
                sf_string.push('\\');
            }
            sf_string.push(c);
        }
        sf_string.push('"');
        Ok(PolicyName {
            name: name.into(),
            sf_string: sf_string.into(),
        })
    }

    /// The name as configured.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(floodgate_http::PolicyName::new("a b")?.as_str(), "a b");
    /// # Ok::<(), floodgate_http::ConfigError>(())
    /// ```
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name as an sf-string: quoted, `"` and `\` escaped.
    pub(crate) fn sf_string(&self) -> &str {
        &self.sf_string
    }
}

impl fmt::Debug for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// How `X-RateLimit-Reset` is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds from now, rounded up ([`Decision::reset_after_secs`]); the default.
    #[default]
    Seconds,
    /// Unix epoch seconds of `now + reset_after`, rounded up.
    UnixEpoch,
}

/// A keyed hash of partition keys for the `pk` parameter: SipHash-2-4 (a PRF) under a
/// 128-bit secret, so a client can tell its partitions apart without learning anyone's
/// key (an IP address, an API key).
///
/// # Examples
///
/// ```
/// use floodgate_http::PartitionKeyHasher;
/// let h = PartitionKeyHasher::new([7; 16]);
/// assert_eq!(h.hash(&"alice"), h.hash(&"alice"));
/// assert_ne!(h.hash(&"alice"), h.hash(&"bob"));
/// assert_ne!(h.hash(&"alice"), PartitionKeyHasher::new([8; 16]).hash(&"alice"));
/// ```
#[derive(Clone)]
pub struct PartitionKeyHasher {
    key: [u8; 16],
}

impl PartitionKeyHasher {
    /// A hasher under `secret` (keep it secret, and the same across replicas if
    /// clients should see stable `pk` values).
    pub fn new(secret: [u8; 16]) -> PartitionKeyHasher {
        PartitionKeyHasher { key: secret }
    }

    /// The 16-byte keyed hash of `key`.
    pub fn hash<K: Hash + ?Sized>(&self, key: &K) -> [u8; 16] {
        use siphasher::sip128::{Hasher128, SipHasher24};
        let mut h = SipHasher24::new_with_key(&self.key);
        key.hash(&mut h);
        h.finish128().as_bytes()
    }
}

impl fmt::Debug for PartitionKeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PartitionKeyHasher { .. }")
    }
}

/// One member of `RateLimit-Policy`.
#[derive(Clone, Copy, Debug)]
pub struct PolicyItem<'a> {
    /// The policy's name.
    pub name: &'a PolicyName,
    /// `q`: the quota (GCRA: the burst).
    pub quota: u64,
    /// `w`: the window in seconds, when known.
    pub window: Option<u64>,
    /// `pk`: a keyed hash of the partition key, when configured.
    pub partition_key: Option<&'a [u8]>,
}

/// One member of `RateLimit`.
#[derive(Clone, Copy, Debug)]
pub struct LimitItem<'a> {
    /// The policy's name.
    pub name: &'a PolicyName,
    /// `r`: whole units remaining.
    pub remaining: u64,
    /// `t`: seconds until the quota resets, rounded up.
    pub reset: u64,
    /// `pk`: a keyed hash of the partition key, when configured.
    pub partition_key: Option<&'a [u8]>,
}

impl<'a> LimitItem<'a> {
    /// The `RateLimit` member for `decision`.
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate::Decision;
    /// use floodgate_http::{LimitItem, PolicyName};
    /// use std::time::Duration;
    /// let name = PolicyName::new("default")?;
    /// let d = Decision::new(true, 100, 42, Duration::from_millis(11_200), None);
    /// let item = LimitItem::from_decision(&name, &d);
    /// assert_eq!((item.remaining, item.reset), (42, 12));
    /// # Ok::<(), floodgate_http::ConfigError>(())
    /// ```
    pub fn from_decision(name: &'a PolicyName, decision: &Decision) -> LimitItem<'a> {
        LimitItem {
            name,
            remaining: decision.remaining(),
            reset: decision.reset_after_secs(),
            partition_key: None,
        }
    }
}

/// The window `w` of a GCRA policy in whole seconds: `⌈B·T⌉`, at least 1 — the time an
/// empty bucket takes to refill completely.
///
/// # Examples
///
/// ```
/// use floodgate::Policy;
/// // 10 per minute, burst 10: T = 6 s, B·T = 60 s.
/// assert_eq!(floodgate_http::window_secs(&Policy::per_minute(10)?), 60);
/// // 100 per second: B·T = 1 s.
/// assert_eq!(floodgate_http::window_secs(&Policy::per_second(100)?), 1);
/// // 1000 per second, burst 1: B·T = 1 ms, reported as 1 s.
/// assert_eq!(floodgate_http::window_secs(&Policy::per_second(1000)?.with_burst(1)?), 1);
/// # Ok::<(), floodgate::PolicyError>(())
/// ```
pub fn window_secs(policy: &Policy) -> u64 {
    let nanos = u128::from(policy.burst()) * u128::from(policy.interval_nanos());
    let secs = nanos.div_ceil(1_000_000_000).max(1);
    u64::try_from(secs).unwrap_or(u64::MAX).min(MAX_SF_INTEGER)
}

/// A duration as a window in whole seconds: rounded up, at least 1.
pub(crate) fn duration_window_secs(d: Duration) -> u64 {
    let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
    secs.clamp(1, MAX_SF_INTEGER)
}

fn sf_int(n: u64) -> u64 {
    n.min(MAX_SF_INTEGER)
}

/// The decimal digits of a `u64`, written right to left into a stack buffer.
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    fn new(mut n: u64) -> Digits {
        let mut buf = [b'0'; 20];
        let mut start = buf.len();
        // `u64::MAX` has 20 digits: the loop ends by `n == 0`.
        for slot in buf.iter_mut().rev() {
            // `n % 10 < 10`: the cast keeps the digit.
            *slot = b'0' + (n % 10) as u8;
            start -= 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Digits { buf, start }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Where a field value is written: a `String` (the public renderers) or a
/// [`FieldBuf`] (the layer). Everything written is printable ASCII.
pub(crate) trait FieldOut {
    fn put(&mut self, s: &[u8]);
    fn is_empty(&self) -> bool;

    /// `", "` before every list member but the first.
    fn separate(&mut self) {
        if !self.is_empty() {
            self.put(b", ");
        }
    }
}

impl FieldOut for String {
    fn put(&mut self, s: &[u8]) {
        // The renderers write ASCII only; anything else would be a bug, left out.
        self.push_str(core::str::from_utf8(s).unwrap_or_default());
    }

    fn is_empty(&self) -> bool {
        String::is_empty(self)
    }
}

/// The bytes a [`FieldBuf`] holds on the stack: the legacy trio and one rule's IETF
/// members take about 70 bytes, so a handful of rules never reach the heap.
const FIELD_INLINE: usize = 256;

/// Field values under construction, one after another: on the stack up to
/// [`FIELD_INLINE`] bytes, on the heap beyond.
pub(crate) struct FieldBuf {
    inline: [u8; FIELD_INLINE],
    inline_len: usize,
    spill: Vec<u8>,
    /// Where the value being written starts.
    start: usize,
}

impl FieldBuf {
    fn new() -> FieldBuf {
        FieldBuf {
            inline: [0; FIELD_INLINE],
            inline_len: 0,
            spill: Vec::new(),
            start: 0,
        }
    }

    fn len(&self) -> usize {
        if self.spill.is_empty() {
            self.inline_len
        } else {
            self.spill.len()
        }
    }

    #[cfg(test)]
    fn as_bytes(&self) -> &[u8] {
        if self.spill.is_empty() {
            &self.inline[..self.inline_len]
        } else {
            &self.spill
        }
    }

    /// The bytes as one shared byte string (one allocation: the stack buffer moves
    /// to the heap, or the spill is taken as it is).
    fn into_bytes(self) -> Bytes {
        if self.spill.is_empty() {
            Bytes::from_owner(self.inline)
        } else {
            Bytes::from(self.spill)
        }
    }
}

impl FieldOut for FieldBuf {
    fn put(&mut self, s: &[u8]) {
        if !self.spill.is_empty() {
            self.spill.extend_from_slice(s);
            return;
        }
        let len = self.inline_len;
        match self.inline.get_mut(len..len + s.len()) {
            Some(dst) => {
                dst.copy_from_slice(s);
                self.inline_len += s.len();
            }
            None => {
                self.spill = Vec::with_capacity(2 * (len + s.len()));
                self.spill.extend_from_slice(&self.inline[..len]);
                self.spill.extend_from_slice(s);
            }
        }
    }

    /// Whether the value being written is still empty.
    fn is_empty(&self) -> bool {
        self.len() == self.start
    }
}

/// A rate-limit field of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    RetryAfter,
    Limit,
    Remaining,
    Reset,
    Policy,
    RateLimit,
    Exceeded,
}

impl Field {
    /// How many fields there are: a response carries each at most once.
    const COUNT: usize = 7;

    fn name(self) -> HeaderName {
        match self {
            Field::RetryAfter => RETRY_AFTER,
            Field::Limit => X_RATELIMIT_LIMIT.clone(),
            Field::Remaining => X_RATELIMIT_REMAINING.clone(),
            Field::Reset => X_RATELIMIT_RESET.clone(),
            Field::Policy => RATELIMIT_POLICY.clone(),
            Field::RateLimit => RATELIMIT.clone(),
            Field::Exceeded => X_RATELIMIT_EXCEEDED.clone(),
        }
    }
}

/// The rate-limit fields of one response, written one after another into one
/// [`FieldBuf`]; their header values are slices of one shared byte string.
pub(crate) struct ResponseFields {
    buf: FieldBuf,
    /// The fields written, in order, each with where its value lies in `buf`.
    written: [(Field, Range<usize>); Field::COUNT],
    count: usize,
}

impl ResponseFields {
    pub(crate) fn new() -> ResponseFields {
        ResponseFields {
            buf: FieldBuf::new(),
            written: [const { (Field::RetryAfter, 0..0) }; Field::COUNT],
            count: 0,
        }
    }

    /// Where the next field's value is written; [`finish`](Self::finish) names it.
    pub(crate) fn value(&mut self) -> &mut FieldBuf {
        &mut self.buf
    }

    /// Ends the value written since the last field as `field`'s. A field written
    /// twice keeps its first value.
    pub(crate) fn finish(&mut self, field: Field) {
        let (start, end) = (self.buf.start, self.buf.len());
        let first = !self.written[..self.count].iter().any(|(f, _)| *f == field);
        match self.written.get_mut(self.count) {
            Some(slot) if first => {
                *slot = (field, start..end);
                self.count += 1;
            }
            // A repeat: its bytes stay in the buffer, unreferenced.
            _ => {}
        }
        self.buf.start = end;
    }

    fn int(&mut self, field: Field, n: u64) {
        self.buf.put(Digits::new(n).as_bytes());
        self.finish(field);
    }

    /// `Retry-After` for a denial (see [`retry_after`]); nothing otherwise.
    pub(crate) fn retry_after(&mut self, decision: &Decision) {
        if !decision.is_allowed() {
            if let Some(secs) = decision.retry_after_secs() {
                self.int(Field::RetryAfter, secs);
            }
        }
    }

    /// The legacy trio (see [`legacy_headers`]).
    pub(crate) fn legacy(&mut self, decision: &Decision, format: ResetFormat, now: SystemTime) {
        self.int(Field::Limit, decision.limit());
        self.int(Field::Remaining, decision.remaining());
        let reset = match format {
            ResetFormat::Seconds => decision.reset_after_secs(),
            ResetFormat::UnixEpoch => {
                // A clock before 1970 reads as the epoch; a sum past SystemTime's
                // range saturates.
                let since = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
                let at = since.saturating_add(decision.reset_after());
                at.as_secs() + u64::from(at.subsec_nanos() > 0)
            }
        };
        self.int(Field::Reset, reset);
    }

    /// Inserts every field written into `headers`. With `keep_service` false, each
    /// replaces the values of its name already there; with it true, each is combined
    /// with them by the rules of
    /// [`HeaderOptions::keep_service_fields`](crate::HeaderOptions::keep_service_fields).
    /// Every byte the renderers write is printable ASCII (validated names, digits,
    /// base64), so no value can be refused; should one ever be, that field is left
    /// out rather than the request failed.
    pub(crate) fn insert_into(self, headers: &mut HeaderMap, keep_service: bool) {
        if self.count == 0 {
            return;
        }
        headers.reserve(self.count);
        let bytes = self.buf.into_bytes();
        let written = &self.written[..self.count];
        let service_trio = keep_service
            && {
                let ours = written
                    .iter()
                    .find(|(field, _)| *field == Field::Remaining)
                    .and_then(|(_, range)| sf_digits(&bytes[range.clone()]));
                matches!((service_trio_remaining(headers), ours), (Some(theirs), Some(ours)) if theirs < ours)
            };
        for (field, range) in written {
            let ours = bytes.slice(range.clone());
            let value = match field {
                Field::Limit | Field::Remaining | Field::Reset if service_trio => continue,
                Field::Policy | Field::RateLimit | Field::Exceeded if keep_service => {
                    combine_lists(ours, headers.get_all(field.name()))
                }
                _ => ours,
            };
            if let Ok(value) = HeaderValue::from_maybe_shared(value) {
                headers.insert(field.name(), value);
            }
        }
    }
}

/// The layer's List field `ours` followed by the members of the service's lines
/// `theirs` whose name (the item or inner list before its parameters) no member of
/// `ours` has; a service line that is not a List ([`list_members`]), or whose
/// members would take the field past the [`MAX_LIST_MEMBERS`] every parser must
/// accept, is left out whole.
fn combine_lists(ours: Bytes, theirs: http::header::GetAll<'_, HeaderValue>) -> Bytes {
    let our_members = list_members(&ours).unwrap_or_default();
    let taken: Vec<&[u8]> = our_members.iter().map(|m| m.name).collect();
    let mut count = our_members.len();
    let mut combined: Option<Vec<u8>> = None;
    for line in theirs {
        let Some(members) = list_members(line.as_bytes()) else {
            continue;
        };
        let kept: Vec<Member<'_>> = members
            .into_iter()
            .filter(|m| !taken.contains(&m.name))
            .collect();
        if count + kept.len() > MAX_LIST_MEMBERS {
            continue;
        }
        count += kept.len();
        for member in kept {
            let out = combined.get_or_insert_with(|| ours.to_vec());
            out.extend_from_slice(b", ");
            out.extend_from_slice(member.text);
        }
    }
    combined.map_or(ours, Bytes::from)
}

/// The most members of a List every RFC 9651 parser must accept (§3.1).
const MAX_LIST_MEMBERS: usize = 1024;
/// The most members of an inner list every parser must accept (§3.1.1).
const MAX_INNER_LIST_MEMBERS: usize = 256;
/// The most parameters on one item or inner list every parser must accept (§3.1.2).
const MAX_PARAMETERS: usize = 256;
/// The longest parameter key every parser must accept, in characters (§3.1.2).
const MAX_KEY_CHARS: usize = 64;
/// The longest sf-string every parser must accept, in characters (§3.3.3).
const MAX_STRING_CHARS: usize = 1024;
/// The longest token every parser must accept, in characters (§3.3.4).
const MAX_TOKEN_CHARS: usize = 512;
/// The longest byte sequence every parser must accept, in octets decoded (§3.3.5).
const MAX_BINARY_OCTETS: usize = 16_384;

/// One member of a Structured Field List line, as the service wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Member<'a> {
    /// The whole member: its item or inner list, and its parameters.
    text: &'a [u8],
    /// Its name: the item or inner list before the parameters.
    name: &'a [u8],
}

/// The members of one line of a Structured Field List, parsed as RFC 9651 §4.2.1
/// parses a List (spaces and tabs around the commas and the line); `None` when the
/// line is not one: a byte outside visible ASCII, space and tab, an empty member,
/// a member that is not an item or inner list with its parameters ([`SfCursor`]),
/// or more members than [`MAX_LIST_MEMBERS`]. An empty line is an empty List.
fn list_members(line: &[u8]) -> Option<Vec<Member<'_>>> {
    let ows = |b: u8| b == b' ' || b == b'\t';
    let line = trim_ows(line);
    let mut at = SfCursor { s: line, i: 0 };
    let mut members = Vec::new();
    if line.is_empty() {
        return Some(members);
    }
    loop {
        let start = at.i;
        let name_end = at.member()?;
        members.push(Member {
            text: &line[start..at.i],
            name: &line[start..name_end],
        });
        if members.len() > MAX_LIST_MEMBERS {
            return None;
        }
        at.eat_while(ows);
        if at.i == line.len() {
            return Some(members);
        }
        if !at.eat(b',') {
            return None;
        }
        at.eat_while(ows);
        if at.i == line.len() {
            return None; // a trailing comma
        }
    }
}

/// A cursor over a Structured Field List line: each method parses one construct
/// of RFC 9651 §4.2 (decoding what a parser decodes, so that what it accepts every
/// parser accepts), returning whether it was one, and leaves the cursor after it.
struct SfCursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl SfCursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    /// Takes `b` if it is next.
    fn eat(&mut self, b: u8) -> bool {
        let next = self.peek() == Some(b);
        self.i += usize::from(next);
        next
    }

    /// Takes the bytes that match `f`; returns how many.
    fn eat_while(&mut self, f: impl Fn(u8) -> bool) -> usize {
        let start = self.i;
        while self.peek().is_some_and(&f) {
            self.i += 1;
        }
        self.i - start
    }

    /// One List member, an item or an inner list with its parameters (§4.2.1.1):
    /// where its name (before the parameters) ends, or `None`.
    fn member(&mut self) -> Option<usize> {
        let named = if self.eat(b'(') {
            self.inner_list()
        } else {
            self.bare_item()
        };
        let name_end = self.i;
        (named && self.parameters()).then_some(name_end)
    }

    /// The rest of an inner list after its `(` (§4.2.1.2): items apart by spaces,
    /// each with its parameters, up to its `)`.
    fn inner_list(&mut self) -> bool {
        let mut items = 0;
        loop {
            self.eat_while(|b| b == b' ');
            if self.eat(b')') {
                return true;
            }
            items += 1;
            if items > MAX_INNER_LIST_MEMBERS || !(self.bare_item() && self.parameters()) {
                return false;
            }
            if !matches!(self.peek(), Some(b' ' | b')')) {
                return false;
            }
        }
    }

    /// `;` key [`=` bare item], any number of times (§4.2.3.2): a key is a
    /// lower-case letter or `*`, then lower-case letters, digits, `_-.*`.
    fn parameters(&mut self) -> bool {
        let mut count = 0;
        while self.eat(b';') {
            count += 1;
            self.eat_while(|b| b == b' ');
            if count > MAX_PARAMETERS || !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
                return false;
            }
            let key = self.i;
            self.eat_while(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*'));
            if self.i - key > MAX_KEY_CHARS || (self.eat(b'=') && !self.bare_item()) {
                return false;
            }
        }
        true
    }

    /// A bare item (§4.2.3.1), by its first byte.
    fn bare_item(&mut self) -> bool {
        let Some(first) = self.peek() else {
            return false;
        };
        match first {
            b'-' | b'0'..=b'9' => self.number(true),
            b'"' => {
                self.i += 1;
                self.string()
            }
            b'%' => {
                self.i += 1;
                self.eat(b'"') && self.display_string()
            }
            b':' => {
                self.i += 1;
                self.byte_sequence()
            }
            b'?' => {
                self.i += 1;
                self.eat(b'0') || self.eat(b'1')
            }
            // A date is an integer, never a decimal (§4.2.9).
            b'@' => {
                self.i += 1;
                self.number(false)
            }
            // A token (§4.2.6): a letter or `*`, then tchar, `:` or `/`.
            b'*' | b'a'..=b'z' | b'A'..=b'Z' => {
                let len = self
                    .eat_while(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b));
                len <= MAX_TOKEN_CHARS
            }
            _ => false,
        }
    }

    /// An integer (1 to 15 digits) or, where `decimal`, a decimal (1 to 12 digits, a
    /// dot, 1 to 3 digits), either with a leading `-` (§4.2.4).
    fn number(&mut self, decimal: bool) -> bool {
        self.eat(b'-');
        let whole = self.eat_while(|b| b.is_ascii_digit());
        if decimal && self.eat(b'.') {
            let fraction = self.eat_while(|b| b.is_ascii_digit());
            (1..=12).contains(&whole) && (1..=3).contains(&fraction)
        } else {
            (1..=15).contains(&whole)
        }
    }

    /// The rest of an sf-string after its `"` (§4.2.5): printable ASCII, `\`
    /// escaping only `"` and `\`, at most [`MAX_STRING_CHARS`] characters.
    fn string(&mut self) -> bool {
        let mut chars = 0;
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return chars <= MAX_STRING_CHARS;
                }
                Some(b'\\') => {
                    self.i += 1;
                    if !(self.eat(b'"') || self.eat(b'\\')) {
                        return false;
                    }
                }
                Some(0x20..=0x7e) => self.i += 1,
                _ => return false,
            }
            chars += 1;
        }
    }

    /// The rest of a display string after its `%"` (§4.2.10): printable ASCII but
    /// `%` and `"`, and `%` before two lower-case hex digits, the octets together
    /// valid UTF-8 (`\` is an ordinary character here).
    fn display_string(&mut self) -> bool {
        let mut octets = Vec::new();
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return core::str::from_utf8(&octets).is_ok();
                }
                Some(b'%') => {
                    self.i += 1;
                    match (self.lower_hex(), self.lower_hex()) {
                        (Some(high), Some(low)) => octets.push(high << 4 | low),
                        _ => return false,
                    }
                }
                Some(b @ 0x20..=0x7e) => {
                    self.i += 1;
                    octets.push(b);
                }
                _ => return false,
            }
        }
    }

    /// One lower-case hex digit's value, taken; `None` (nothing taken) otherwise.
    fn lower_hex(&mut self) -> Option<u8> {
        let value = match self.peek()? {
            b @ b'0'..=b'9' => b - b'0',
            b @ b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        self.i += 1;
        Some(value)
    }

    /// The rest of a byte sequence after its `:` (§4.2.7), up to its `:`: base64 as
    /// RFC 9651 writes it (§4.1.8) — with its `=` padding, the unused bits of the
    /// last character zero — since a parser may refuse other forms (RFC 4648 §3.2,
    /// §3.5), at most [`MAX_BINARY_OCTETS`] decoded.
    fn byte_sequence(&mut self) -> bool {
        let start = self.i;
        self.eat_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
        let content = &self.s[start..self.i];
        if !self.eat(b':') || content.len() % 4 != 0 {
            return false;
        }
        let data = content.len() - content.iter().rev().take_while(|&&b| b == b'=').count();
        let pad = content.len() - data;
        if pad > 2 || content[..data].contains(&b'=') {
            return false;
        }
        let unused_bits_zero = match (pad, data.checked_sub(1).map(|i| content[i])) {
            (0, _) | (_, None) => true,
            (pad, Some(last)) => {
                let sextet = match last {
                    b'A'..=b'Z' => last - b'A',
                    b'a'..=b'z' => last - b'a' + 26,
                    b'0'..=b'9' => last - b'0' + 52,
                    b'+' => 62,
                    _ => 63,
                };
                // `xy==` uses 2 bits of `y`'s 6, `xyz=` 4 of `z`'s: the rest are 0.
                let unused = if pad == 2 { 0b1111 } else { 0b11 };
                sextet & unused == 0
            }
        };
        unused_bits_zero && content.len() / 4 * 3 - pad <= MAX_BINARY_OCTETS
    }
}

/// `piece` without the spaces and tabs around it.
fn trim_ows(piece: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = piece.iter().position(|b| !ows(b)).unwrap_or(piece.len());
    let end = piece.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &piece[start..end]
}

/// The service's `X-RateLimit-Remaining` when it wrote the whole trio, each field
/// once as a Structured Field integer; `None` otherwise.
fn service_trio_remaining(headers: &HeaderMap) -> Option<u64> {
    let single = |name: &HeaderName| {
        let mut lines = headers.get_all(name).iter();
        match (lines.next(), lines.next()) {
            (Some(value), None) => sf_digits(value.as_bytes()),
            _ => None,
        }
    };
    single(&X_RATELIMIT_LIMIT)?;
    single(&X_RATELIMIT_RESET)?;
    single(&X_RATELIMIT_REMAINING)
}

/// A non-negative Structured Field integer: 1 to 15 digits.
fn sf_digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 15 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// Standard base64 with padding, as sf-binary wants it.
fn write_base64(out: &mut impl FieldOut, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sym = |i: u32| ALPHABET[(i & 63) as usize];
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let quad = [
            sym(n >> 18),
            sym(n >> 12),
            if chunk.len() > 1 { sym(n >> 6) } else { b'=' },
            if chunk.len() > 2 { sym(n) } else { b'=' },
        ];
        out.put(&quad);
    }
}

fn write_int(out: &mut impl FieldOut, key: &[u8], n: u64) {
    out.put(key);
    out.put(Digits::new(n).as_bytes());
}

fn write_pk(out: &mut impl FieldOut, pk: Option<&[u8]>) {
    if let Some(pk) = pk {
        out.put(b";pk=:");
        write_base64(out, pk);
        out.put(b":");
    }
}

/// Appends one `RateLimit-Policy` member.
pub(crate) fn write_policy_member(out: &mut impl FieldOut, item: &PolicyItem<'_>) {
    out.separate();
    out.put(item.name.sf_string().as_bytes());
    write_int(out, b";q=", sf_int(item.quota));
    if let Some(w) = item.window {
        write_int(out, b";w=", w.clamp(1, MAX_SF_INTEGER));
    }
    write_pk(out, item.partition_key);
}

/// Appends one `RateLimit` member.
pub(crate) fn write_limit_member(out: &mut impl FieldOut, item: &LimitItem<'_>) {
    out.separate();
    out.put(item.name.sf_string().as_bytes());
    write_int(out, b";r=", sf_int(item.remaining));
    write_int(out, b";t=", sf_int(item.reset));
    write_pk(out, item.partition_key);
}

/// Appends an sf-string member (a policy name) to a list.
pub(crate) fn write_name_member(out: &mut impl FieldOut, name: &PolicyName) {
    out.separate();
    out.put(name.sf_string().as_bytes());
}

/// Appends `RateLimit-Policy` members to `out` (a list, `", "`-separated).
///
/// # Examples
///
/// ```
/// use floodgate_http::{render_policy, PolicyItem, PolicyName};
/// let name = PolicyName::new("default")?;
/// let mut out = String::new();
/// render_policy(&mut out, &[PolicyItem { name: &name, quota: 100, window: Some(60), partition_key: None }]);
/// assert_eq!(out, r#""default";q=100;w=60"#);
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
pub fn render_policy(out: &mut String, items: &[PolicyItem<'_>]) {
    for item in items {
        write_policy_member(out, item);
    }
}

/// Appends `RateLimit` members to `out` (a list, `", "`-separated).
///
/// # Examples
///
/// ```
/// use floodgate_http::{render_limit, LimitItem, PolicyName};
/// let name = PolicyName::new("default")?;
/// let mut out = String::new();
/// render_limit(&mut out, &[LimitItem { name: &name, remaining: 42, reset: 12, partition_key: None }]);
/// assert_eq!(out, r#""default";r=42;t=12"#);
/// # Ok::<(), floodgate_http::ConfigError>(())
/// ```
pub fn render_limit(out: &mut String, items: &[LimitItem<'_>]) {
    for item in items {
        write_limit_member(out, item);
    }
}

/// `Retry-After` for `decision`: whole seconds rounded up (at least 1) on a denial;
/// `None` when allowed and when the request can never fit (`retry_after` is never:
/// a client must not be told to retry).
///
/// # Examples
///
/// ```
/// use floodgate::Decision;
/// use std::time::Duration;
/// let deny = |ms| Decision::new(false, 1, 0, Duration::ZERO, Some(Duration::from_millis(ms)));
/// assert_eq!(floodgate_http::retry_after(&deny(300)).unwrap(), "1");
/// assert_eq!(floodgate_http::retry_after(&deny(1_900)).unwrap(), "2");
/// assert!(floodgate_http::retry_after(&Decision::new(false, 1, 0, Duration::ZERO, None)).is_none());
/// ```
pub fn retry_after(decision: &Decision) -> Option<HeaderValue> {
    if decision.is_allowed() {
        return None;
    }
    decision.retry_after_secs().map(HeaderValue::from)
}

/// Writes `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` for
/// `decision` into `headers` (replacing earlier values); `now` is used by
/// [`ResetFormat::UnixEpoch`] only.
///
/// # Examples
///
/// ```
/// use floodgate::Decision;
/// use floodgate_http::{legacy_headers, ResetFormat};
/// use http::HeaderMap;
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// let d = Decision::new(true, 10, 7, Duration::from_millis(2_500), None);
/// let mut h = HeaderMap::new();
/// legacy_headers(&mut h, &d, ResetFormat::Seconds, SystemTime::now());
/// assert_eq!(h["x-ratelimit-limit"], "10");
/// assert_eq!(h["x-ratelimit-remaining"], "7");
/// assert_eq!(h["x-ratelimit-reset"], "3");
/// let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
/// legacy_headers(&mut h, &d, ResetFormat::UnixEpoch, now);
/// assert_eq!(h["x-ratelimit-reset"], "1700000003");
/// ```
pub fn legacy_headers(
    headers: &mut HeaderMap,
    decision: &Decision,
    format: ResetFormat,
    now: SystemTime,
) {
    let mut fields = ResponseFields::new();
    fields.legacy(decision, format, now);
    fields.insert_into(headers, false);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> PolicyName {
        PolicyName::new(s).expect("valid test name")
    }

    #[test]
    fn policy_names_are_validated() {
        assert!(PolicyName::new("default").is_ok());
        assert!(PolicyName::new("with space and \"quote\"").is_ok());
        let err = PolicyName::new("tab\there").unwrap_err();
        assert!(err.to_string().contains("tab\\there"), "{err}");
        assert!(PolicyName::new(&"x".repeat(65)).is_err());
        assert!(PolicyName::new(&"x".repeat(64)).is_ok());
        assert!(PolicyName::new("é").is_err());
        assert!(PolicyName::new("\u{7f}").is_err());
    }

    #[test]
    fn policy_list_exact() {
        let a = name("per-ip");
        let b = name("global");
        let mut out = String::new();
        render_policy(
            &mut out,
            &[
                PolicyItem {
                    name: &a,
                    quota: 10,
                    window: Some(60),
                    partition_key: None,
                },
                PolicyItem {
                    name: &b,
                    quota: 1000,
                    window: None,
                    partition_key: None,
                },
            ],
        );
        assert_eq!(out, r#""per-ip";q=10;w=60, "global";q=1000"#);
    }

    #[test]
    fn limit_list_exact_with_escapes_and_pk() {
        let a = name(r#"a"b\c"#);
        let mut out = String::new();
        render_limit(
            &mut out,
            &[LimitItem {
                name: &a,
                remaining: 0,
                reset: 1,
                partition_key: Some(b"\x00\x01\x02\x03"),
            }],
        );
        assert_eq!(out, r#""a\"b\\c";r=0;t=1;pk=:AAECAw==:"#);
    }

    #[test]
    fn integers_are_clamped() {
        let a = name("big");
        let mut out = String::new();
        render_policy(
            &mut out,
            &[PolicyItem {
                name: &a,
                quota: u64::MAX,
                window: Some(u64::MAX),
                partition_key: None,
            }],
        );
        assert_eq!(out, r#""big";q=999999999999999;w=999999999999999"#);
        let mut out = String::new();
        render_limit(
            &mut out,
            &[LimitItem {
                name: &a,
                remaining: u64::MAX,
                reset: MAX_SF_INTEGER + 1,
                partition_key: None,
            }],
        );
        assert_eq!(out, r#""big";r=999999999999999;t=999999999999999"#);
    }

    #[test]
    fn window_zero_renders_as_one() {
        let a = name("w");
        let mut out = String::new();
        render_policy(
            &mut out,
            &[PolicyItem {
                name: &a,
                quota: 1,
                window: Some(0),
                partition_key: None,
            }],
        );
        assert_eq!(out, r#""w";q=1;w=1"#);
    }

    #[test]
    fn digits() {
        for n in (0..1_100).chain([12_345, u64::from(u32::MAX), u64::MAX]) {
            assert_eq!(Digits::new(n).as_bytes(), n.to_string().as_bytes());
        }
    }

    #[test]
    fn fields_share_one_buffer_and_spill_intact() {
        // Many long members: past the stack buffer, onto the heap.
        let mut fields = ResponseFields::new();
        let mut expected = String::new();
        for i in 0..100u64 {
            let name = name(&format!("rule \"{i}\""));
            let item = LimitItem {
                name: &name,
                remaining: i,
                reset: 1,
                partition_key: Some(&[0xfb; 16]),
            };
            write_limit_member(fields.value(), &item);
            render_limit(&mut expected, &[item]);
        }
        assert!(expected.len() > FIELD_INLINE);
        assert_eq!(fields.buf.as_bytes(), expected.as_bytes());
        fields.finish(Field::RateLimit);
        let d = Decision::new(
            false,
            7,
            0,
            Duration::from_secs(3),
            Some(Duration::from_millis(1)),
        );
        fields.retry_after(&d);
        fields.legacy(&d, ResetFormat::Seconds, UNIX_EPOCH);
        // A field finished twice keeps its first value.
        fields.int(Field::Limit, 99);
        let mut h = HeaderMap::new();
        h.insert(&X_RATELIMIT_LIMIT, HeaderValue::from_static("replaced"));
        fields.insert_into(&mut h, false);
        assert_eq!(h[&RATELIMIT], expected.as_str());
        assert_eq!(h[RETRY_AFTER], "1");
        assert_eq!(h[&X_RATELIMIT_LIMIT], "7");
        assert_eq!(h[&X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[&X_RATELIMIT_RESET], "3");
        assert_eq!(h.len(), 5);
    }

    #[test]
    fn service_lists_split_outside_strings_only() {
        let texts = |line: &'static [u8]| {
            list_members(line).map(|ms| ms.into_iter().map(|m| m.text).collect::<Vec<_>>())
        };
        assert_eq!(texts(b""), Some(vec![]));
        assert_eq!(texts(b" \t "), Some(vec![]));
        assert_eq!(
            texts(b" \"a,b\";r=1 ,\t\"c\\\",\"; d"),
            Some(vec![&br#""a,b";r=1"#[..], &br#""c\","; d"#[..]])
        );
        // A display string's `\` escapes nothing: its `"` ends it.
        assert_eq!(
            texts(br#"%"a\", b"#),
            Some(vec![&br#"%"a\""#[..], &b"b"[..]])
        );
        // Not RFC 9651 members: a space before a parameter, an upper-case key, an
        // escape of neither `"` nor `\`, an empty member, a string left open,
        // non-ASCII.
        assert_eq!(texts(br#""c" ;d"#), None);
        assert_eq!(texts(b"a;R=1"), None);
        assert_eq!(texts(br#""a\q""#), None);
        assert_eq!(texts(b"a,"), None);
        assert_eq!(texts(b",a"), None);
        assert_eq!(texts(b"a,,b"), None);
        assert_eq!(texts(br#""a\""#), None);
        assert_eq!(texts("\"caf\u{e9}\"".as_bytes()), None);
        let names = |line: &'static [u8]| {
            list_members(line).map(|ms| ms.into_iter().map(|m| m.name).collect::<Vec<_>>())
        };
        assert_eq!(
            names(br#""a;b";r=1, token, (x "y");q=2, %"z;";w=3"#),
            Some(vec![&br#""a;b""#[..], b"token", br#"(x "y")"#, br#"%"z;""#])
        );
        assert_eq!(sf_digits(b"999999999999999"), Some(MAX_SF_INTEGER));
        assert_eq!(sf_digits(b"1000000000000000"), None);
        assert_eq!(sf_digits(b"-1"), None);
    }

    #[test]
    fn byte_sequences_are_base64_as_rfc_9651_writes_it() {
        let one = |member: &[u8]| list_members(member).is_some_and(|ms| ms.len() == 1);
        // Kept: as RFC 9651 writes it. Not: unpadded, padding in the middle or too
        // long, unused bits set, a length no padding explains, a character outside
        // the alphabet, left open.
        let cases: [(&[u8], bool); 16] = [
            (b"::", true),
            (b":Zg==:", true),
            (b":Zm8=:", true),
            (b":Zm9v:", true),
            (b":Zm9vYg==:", true),
            (b"://79:", true),
            (b":Zg:", false),
            (b":Zm8:", false),
            (b":Zg=:", false),
            (b":Z===:", false),
            (b":Zg==Zg==:", false),
            (b":Zh==:", false),
            (b":Zm9=:", false),
            (b":Zm9vY:", false),
            (b":Zm9v-A==:", false),
            (b":Zm9v", false),
        ];
        for (member, kept) in cases {
            assert_eq!(one(member), kept, "{}", String::from_utf8_lossy(member));
        }
        // Every byte string round-trips through the layer's own writer.
        for len in 0..8 {
            let bytes: Vec<u8> = (0..len).map(|i| 0xff - i as u8 * 37).collect();
            let mut member = String::from(":");
            write_base64(&mut member, &bytes);
            member.push(':');
            assert!(one(member.as_bytes()), "{member}");
        }
    }

    #[test]
    fn members_stay_within_the_sizes_every_parser_must_accept() {
        let one = |member: &str| list_members(member.as_bytes()).is_some_and(|ms| ms.len() == 1);
        let at_and_past = |make: &dyn Fn(usize) -> String, max: usize| {
            assert!(one(&make(max)), "{max}");
            assert!(!one(&make(max + 1)), "{}", max + 1);
        };
        at_and_past(&|n| format!("\"{}\"", "a".repeat(n)), MAX_STRING_CHARS);
        at_and_past(&|n| format!("\"{}\"", "\\\"".repeat(n)), MAX_STRING_CHARS);
        at_and_past(&|n| "t".repeat(n), MAX_TOKEN_CHARS);
        // 16 384 octets are 5 462 quads, the last `AA==` (one octet).
        at_and_past(
            &|n| {
                let quads = n.div_ceil(3);
                let pad = ["", "AA==", "AAA="][n % 3];
                let full = if pad.is_empty() { quads } else { quads - 1 };
                format!(":{}{pad}:", "AAAA".repeat(full))
            },
            MAX_BINARY_OCTETS,
        );
        at_and_past(
            &|n| format!("({})", vec!["i"; n].join(" ")),
            MAX_INNER_LIST_MEMBERS,
        );
        at_and_past(&|n| format!("i{}", ";k".repeat(n)), MAX_PARAMETERS);
        // A key of 64 characters, bare or with a value, on an item or an inner list.
        at_and_past(&|n| format!("i;{}", "k".repeat(n)), MAX_KEY_CHARS);
        at_and_past(&|n| format!("i;a;{}=?1", "k".repeat(n)), MAX_KEY_CHARS);
        at_and_past(&|n| format!("(i);{}=1", "k".repeat(n)), MAX_KEY_CHARS);
        let members = |n: usize| vec!["m"; n].join(", ");
        assert_eq!(
            list_members(members(MAX_LIST_MEMBERS).as_bytes()).map(|m| m.len()),
            Some(MAX_LIST_MEMBERS)
        );
        assert_eq!(list_members(members(MAX_LIST_MEMBERS + 1).as_bytes()), None);

        // Combined: a service line that would take the field past the bound is
        // left out whole; one that fits is kept.
        let ours = Bytes::from_static(br#""a";r=1"#);
        let mut h = HeaderMap::new();
        h.append(
            &RATELIMIT,
            HeaderValue::from_str(&members(MAX_LIST_MEMBERS)).unwrap(),
        );
        h.append(&RATELIMIT, HeaderValue::from_static("z"));
        let combined = combine_lists(ours.clone(), h.get_all(&RATELIMIT));
        assert_eq!(&combined[..], br#""a";r=1, z"#);
        let mut h = HeaderMap::new();
        h.append(
            &RATELIMIT,
            HeaderValue::from_str(&members(MAX_LIST_MEMBERS - 1)).unwrap(),
        );
        let combined = combine_lists(ours, h.get_all(&RATELIMIT));
        assert_eq!(
            list_members(&combined).map(|m| m.len()),
            Some(MAX_LIST_MEMBERS)
        );
    }

    #[test]
    fn list_separators_restart_with_each_field() {
        let (a, b) = (name("a"), name("b"));
        let mut fields = ResponseFields::new();
        write_name_member(fields.value(), &a);
        write_name_member(fields.value(), &b);
        fields.finish(Field::Exceeded);
        fields.int(Field::Reset, 0);
        write_name_member(fields.value(), &b);
        fields.finish(Field::Policy);
        let mut h = HeaderMap::new();
        fields.insert_into(&mut h, false);
        assert_eq!(h[&X_RATELIMIT_EXCEEDED], r#""a", "b""#);
        assert_eq!(h[&X_RATELIMIT_RESET], "0");
        assert_eq!(h[&RATELIMIT_POLICY], r#""b""#);
    }

    #[test]
    fn base64_padding() {
        let enc = |b: &[u8]| {
            let mut s = String::new();
            write_base64(&mut s, b);
            s
        };
        assert_eq!(enc(b""), "");
        assert_eq!(enc(b"f"), "Zg==");
        assert_eq!(enc(b"fo"), "Zm8=");
        assert_eq!(enc(b"foo"), "Zm9v");
        assert_eq!(enc(b"foob"), "Zm9vYg==");
        assert_eq!(enc(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn retry_after_rounds_up_and_never_is_absent() {
        let deny = |d| Decision::new(false, 5, 0, Duration::ZERO, Some(d));
        assert_eq!(retry_after(&deny(Duration::from_millis(300))).unwrap(), "1");
        assert_eq!(
            retry_after(&deny(Duration::from_millis(1_900))).unwrap(),
            "2"
        );
        assert_eq!(retry_after(&deny(Duration::from_secs(2))).unwrap(), "2");
        assert_eq!(retry_after(&deny(Duration::ZERO)).unwrap(), "1");
        assert!(retry_after(&Decision::new(false, 5, 0, Duration::ZERO, None)).is_none());
        assert!(retry_after(&Decision::new(true, 5, 4, Duration::ZERO, None)).is_none());
    }

    #[test]
    fn legacy_epoch_rounds_up_and_saturates() {
        let d = Decision::new(true, 3, 2, Duration::from_millis(1), None);
        let mut h = HeaderMap::new();
        let now = UNIX_EPOCH + Duration::from_secs(100);
        legacy_headers(&mut h, &d, ResetFormat::UnixEpoch, now);
        assert_eq!(h["x-ratelimit-reset"], "101");
        legacy_headers(&mut h, &d, ResetFormat::UnixEpoch, UNIX_EPOCH);
        assert_eq!(h["x-ratelimit-reset"], "1");
        let fresh = Decision::new(true, 3, 3, Duration::ZERO, None);
        legacy_headers(&mut h, &fresh, ResetFormat::Seconds, now);
        assert_eq!(h["x-ratelimit-reset"], "0");
        assert_eq!(h["x-ratelimit-remaining"], "3");
    }

    #[test]
    fn gcra_window() {
        let p = Policy::per_minute(10).unwrap();
        assert_eq!(window_secs(&p), 60);
        let p = Policy::per_second(3).unwrap();
        // T = ⌈1e9/3⌉ = 333_333_334 ns; B·T = 1_000_000_002 ns → 2 s (rounded up).
        assert_eq!(window_secs(&p), 2);
        assert_eq!(duration_window_secs(Duration::from_millis(1)), 1);
        assert_eq!(duration_window_secs(Duration::from_millis(60_001)), 61);
        assert_eq!(duration_window_secs(Duration::ZERO), 1);
    }

    #[test]
    fn the_longest_duration_is_a_clamped_window() {
        // `as_secs()` is u64::MAX and a fraction remains: rounding up must not wrap.
        assert_eq!(duration_window_secs(Duration::MAX), MAX_SF_INTEGER);
        assert_eq!(
            duration_window_secs(Duration::new(u64::MAX, 1)),
            MAX_SF_INTEGER
        );
    }
}
