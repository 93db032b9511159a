//! `HeaderOptions::keep_service_fields(true)` on any `RateLimit`, `RateLimit-Policy`
//! and `X-RateLimit-Exceeded` lines a service writes: the layer never panics, and the
//! field it answers with is judged by an independent RFC 9651 parser (the `sfv`
//! crate, this target's oracle):
//!
//! * the merged field parses as a List;
//! * it opens with the layer's own members, in rule order, each a String naming its
//!   rule with its own parameters (`q`/`w`, `r`/`t`, none for `Exceeded`; `pk` never,
//!   as no rule here has a partition key);
//! * no later member has the bare item of one of the layer's (never shadowed);
//! * the rest is the service's lines, each kept whole (less the members named like
//!   the layer's) or left out whole, in order, and a kept line is one `sfv` parsed;
//! * the merged field stays within the sizes RFC 9651 §3 has every parser accept
//!   (1 024 members, 256 in an inner list, 256 parameters, 64 characters in a
//!   parameter's key, 1 024 characters in a string, 512 in a token, 16 384 octets in
//!   a byte sequence);
//! * a kept line writes each byte sequence as RFC 9651 writes it (§4.1.8: `=`
//!   padding, the unused bits zero);
//! * conversely, a line within every size of §3 that `sfv` parses and serialises
//!   back to itself byte for byte is kept, when its members fit the merged field's
//!   1 024.
//!
//! Where `sfv` and the promise part, RFC 9651 rules, and the target says so above:
//! `sfv` enforces none of §3's sizes (a parser may refuse more), and reads base64
//! without its padding or with unused bits set (§4.2.7 has parsers SHOULD NOT fail on
//! them, so a strict parser may): the layer leaves such lines out, and the two checks
//! above hold it to that, beyond "kept ⇒ `sfv` parsed". And a line is judged as HTTP
//! hands it to a parser, without the spaces and tabs at its edges (RFC 9110 §5.5),
//! where `sfv`, reading RFC 9651 §4.2 to the letter, refuses a leading tab.
//!
//! Input: a first line naming the rules (`|`-separated, 1 to 3; the first a soft rule
//! every request exceeds, so all three fields are written; empty: `warn|global`),
//! then the service's lines, each for all three fields or, after a leading byte 1, 2
//! or 3, for `RateLimit`, `RateLimit-Policy` or `X-RateLimit-Exceeded` alone (at most
//! 3 a field). A first line starting `!` instead generates the lines from the rest: a
//! small RFC 9651 grammar, mostly valid, with random corruptions.
#![no_main]

use arbitrary::{Result as AResult, Unstructured};
use floodgate::{Gcra, ManualClock, Policy, RateLimiter};
use floodgate_http::{Global, HeaderOptions, PolicyName, RateLimitLayer, Rule, Strategy};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use libfuzzer_sys::fuzz_target;
use sfv::{BareItem, FieldType, List, ListEntry, Parameters, Parser};
use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tower::{Layer, Service};

const FIELDS: [&str; 3] = ["ratelimit", "ratelimit-policy", "x-ratelimit-exceeded"];
/// The parameters of the layer's members in each field of [`FIELDS`], and how many
/// of them it always writes (`w` only for a rule with a window).
const OUR_PARAMS: [(&[&str], usize); 3] = [(&["r", "t"], 2), (&["q", "w"], 1), (&[], 0)];
const MAX_LINES: usize = 3;

/// The upstream: answers every request with the service's lines.
#[derive(Clone)]
struct Upstream(Arc<Vec<(HeaderName, HeaderValue)>>);

impl Service<Request<()>> for Upstream {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let mut resp = Response::new(());
        for (name, value) in self.0.iter() {
            resp.headers_mut().append(name.clone(), value.clone());
        }
        ready(Ok(resp))
    }
}

/// Names the generator and the name table draw on: plain, escaped in an sf-string,
/// and characters the List grammar gives meaning to.
const NAMES: [&str; 8] = [
    "warn", "global", "a\"b", "a\\b", "x y", "a,b", "%\"", "login",
];

fuzz_target!(|data: &[u8]| {
    let (control, rest) = match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let mut lines: [Vec<Vec<u8>>; 3] = Default::default();
    let names: Vec<String> = if control.first() == Some(&b'!') {
        let mut u = Unstructured::new(&control[1..]);
        let Ok(names) = gen_names(&mut u) else { return };
        let mut u = Unstructured::new(rest);
        for (f, field) in lines.iter_mut().enumerate() {
            let n = u.int_in_range(0..=MAX_LINES).unwrap_or(0);
            // The layer's members in this field: one per rule, the soft rule's alone
            // in `X-RateLimit-Exceeded`.
            let ours = if f == 2 { 1 } else { names.len() };
            for _ in 0..n {
                let line = if u.ratio(1, 8).unwrap_or(false) {
                    gen_edge_line(&mut u, ours)
                } else {
                    gen_line(&mut u, &names)
                };
                field.push(line.unwrap_or_default());
            }
        }
        names
    } else {
        let Ok(control) = std::str::from_utf8(control) else {
            return;
        };
        let control = if control.is_empty() {
            "warn|global"
        } else {
            control
        };
        for line in rest.split(|&b| b == b'\n') {
            match line.first() {
                Some(&f @ 1..=3) => lines[usize::from(f - 1)].push(line[1..].to_vec()),
                _ => lines.iter_mut().for_each(|l| l.push(line.to_vec())),
            }
        }
        control.split('|').take(3).map(str::to_owned).collect()
    };
    check(&names, &lines);
});

fn gen_names(u: &mut Unstructured<'_>) -> AResult<Vec<String>> {
    let n = u.int_in_range(1..=3)?;
    let mut names = Vec::new();
    for _ in 0..n {
        let name = if u.ratio(3, 4)? {
            (*u.choose(&NAMES)?).to_owned()
        } else {
            let s: &str = u.arbitrary()?;
            s.to_owned()
        };
        // Only names a rule takes: the generator writes them as sf-strings.
        if PolicyName::new(&name).is_ok() {
            names.push(name);
        }
    }
    if names.is_empty() {
        return Err(arbitrary::Error::NotEnoughData);
    }
    Ok(names)
}

fn check(names: &[String], lines: &[Vec<Vec<u8>>; 3]) {
    // The service's lines, as HeaderValue takes them (others cannot be written).
    let mut service = Vec::new();
    let mut valid: [Vec<&[u8]>; 3] = Default::default();
    for (f, field) in lines.iter().enumerate() {
        for line in field.iter().take(MAX_LINES) {
            if let Ok(v) = HeaderValue::from_bytes(line) {
                service.push((HeaderName::from_static(FIELDS[f]), v));
                // HTTP leaves the spaces and tabs around a line out of its field value
                // (RFC 9110 §5.5), where RFC 9651 §4.2 discards leading spaces only: a
                // line is judged as HTTP hands it to a parser.
                valid[f].push(trim_ows(line));
            }
        }
    }
    let clock = ManualClock::new();
    let limiter = |n| {
        Policy::per_minute(n).map(|p| RateLimiter::<Gcra, _>::gcra_with_clock(p, clock.clone()))
    };
    let mut builder = RateLimitLayer::builder();
    for (i, name) in names.iter().enumerate() {
        let rule = if i == 0 {
            // Cost 2 of a burst of 1: every request exceeds it, and is let through.
            Rule::remote(name, limiter(1).unwrap(), Global)
                .map(|r| r.cost(2).strategy(Strategy::Soft))
        } else {
            Rule::new(name, limiter(5).unwrap(), Global)
        };
        let Ok(rule) = rule else { return };
        builder = builder.rule(rule);
    }
    let Ok(layer) = builder
        .headers(HeaderOptions::default().keep_service_fields(true))
        .build()
    else {
        return;
    };
    let mut svc = layer.layer(Upstream(Arc::new(service)));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(svc.poll_ready(&mut cx).is_ready());
    let mut fut = pin!(svc.call(Request::new(())));
    let resp = loop {
        // Nothing here waits: every limiter is in-process and the upstream is ready.
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            break r.unwrap();
        }
    };
    for (f, service) in valid.iter().enumerate() {
        judge(f, names, service, resp.headers());
    }
}

/// `line` without the spaces and tabs around it.
fn trim_ows(line: &[u8]) -> &[u8] {
    let ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = line.iter().position(|b| !ows(b)).unwrap_or(line.len());
    let end = line.iter().rposition(|b| !ows(b)).map_or(start, |i| i + 1);
    &line[start..end]
}

fn sf_string(name: &str) -> BareItem {
    BareItem::String(
        sfv::String::from_string(name.to_owned()).expect("a policy name is an sf-string"),
    )
}

fn judge(f: usize, names: &[String], service: &[&[u8]], headers: &HeaderMap) {
    let field = FIELDS[f];
    let out: Vec<&[u8]> = headers
        .get_all(field)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    assert_eq!(out.len(), 1, "{field}: one merged line, got {out:?}");
    let shown = String::from_utf8_lossy(out[0]);
    let merged: List = Parser::new(out[0])
        .parse()
        .unwrap_or_else(|e| panic!("{field}: the merged line {shown:?} does not parse: {e}"));
    within_minimums(field, &shown, &merged);
    // The layer's own members: one per rule (the soft rule only in Exceeded).
    let ours: Vec<BareItem> = if f == 2 { &names[..1] } else { names }
        .iter()
        .map(|n| sf_string(n))
        .collect();
    assert!(
        merged.len() >= ours.len(),
        "{field}: {shown:?} lacks the layer's members"
    );
    for (entry, name) in merged.iter().zip(&ours) {
        let ListEntry::Item(item) = entry else {
            panic!("{field}: {shown:?}: the layer's member is an inner list")
        };
        assert_eq!(
            &item.bare_item, name,
            "{field}: {shown:?}: the layer's members first"
        );
        let keys: Vec<&str> = item.params.keys().map(|k| k.as_str()).collect();
        let (params, required) = OUR_PARAMS[f];
        assert!(
            (required..=params.len()).any(|n| keys == params[..n]),
            "{field}: {shown:?}: the layer's own parameters"
        );
        assert!(item
            .params
            .values()
            .all(|v| v.as_integer().is_some_and(|n| i64::from(n) >= 0)));
    }
    let theirs = &merged[ours.len()..];
    let named_like_ours =
        |e: &ListEntry| matches!(e, ListEntry::Item(i) if ours.contains(&i.bare_item));
    assert!(
        !theirs.iter().any(named_like_ours),
        "{field}: {shown:?}: a service member shadows the layer's"
    );
    // Each service line as sfv reads it, less the members named like the layer's.
    let parsed: Vec<Option<List>> = service
        .iter()
        .map(|line| {
            Parser::new(line)
                .parse::<List>()
                .ok()
                .map(|l| l.into_iter().filter(|e| !named_like_ours(e)).collect())
        })
        .collect();
    // Which lines were kept: some choice of sfv-parsed lines, in order, makes up the rest.
    let kept = (0u32..1 << service.len()).find(|mask| {
        let mut want = Vec::new();
        for (i, p) in parsed.iter().enumerate() {
            if mask & 1 << i != 0 {
                match p {
                    Some(members) => want.extend(members.iter().cloned()),
                    None => return false,
                }
            }
        }
        want == theirs
    });
    let Some(kept) = kept else {
        panic!(
            "{field}: {shown:?}: the service's members are not whole lines sfv parsed: {:?}",
            service
                .iter()
                .map(|l| String::from_utf8_lossy(l))
                .collect::<Vec<_>>()
        )
    };
    // A kept line writes its byte sequences as RFC 9651 does (§4.1.8: padded, unused
    // bits zero); `sfv` reads other forms too, a strict parser may not.
    for (i, p) in parsed.iter().enumerate() {
        if kept & 1 << i == 0 {
            continue;
        }
        for b in p.iter().flatten().flat_map(byte_sequences) {
            let canonical = serialize(BareItem::ByteSequence(b));
            assert!(
                service[i]
                    .windows(canonical.len())
                    .any(|w| w == canonical.as_bytes()),
                "{field}: {shown:?}: kept {:?}, whose byte sequence is not {canonical}",
                String::from_utf8_lossy(service[i])
            );
        }
    }
    // A canonical line within RFC 9651 §3's sizes is kept exactly when its members
    // (less those named like the layer's) fit the 1 024 of the merged field after the
    // members before it (unless another choice of lines gives the same members, e.g.
    // a line whose members are all the layer's). Above a size a parser may refuse the
    // field, so the layer leaves the line out: `within_minimums` above.
    let mut before = ours.len();
    for (i, line) in service.iter().enumerate() {
        let members = parsed[i].as_ref().map_or(0, Vec::len);
        let Ok(list) = Parser::new(line).parse::<List>() else {
            continue;
        };
        let canonical = !list.is_empty() && list.serialize().is_some_and(|s| s.as_bytes() == *line);
        let redundant = members == 0;
        if canonical && within_sizes(&list) && !redundant {
            let fits = before + members <= 1024;
            let shown_line = String::from_utf8_lossy(line);
            if fits {
                assert!(
                    kept & 1 << i != 0 || kept_elsewhere(&parsed, kept, i),
                    "{field}: {shown:?}: the canonical line {shown_line:?} ({members} members \
                     after {before}) was left out",
                );
            } else {
                assert!(
                    kept & 1 << i == 0,
                    "{field}: {shown:?}: the line {shown_line:?} ({members} members after \
                     {before}) was kept past 1 024 members",
                );
            }
        }
        if kept & 1 << i != 0 {
            before += members;
        }
    }
}

/// The byte sequences of a List member: its item or inner list's, its parameters'.
fn byte_sequences(entry: &ListEntry) -> Vec<Vec<u8>> {
    let (items, params): (Vec<&BareItem>, &Parameters) = match entry {
        ListEntry::Item(i) => (vec![&i.bare_item], &i.params),
        ListEntry::InnerList(l) => (l.items.iter().map(|i| &i.bare_item).collect(), &l.params),
    };
    let inner = match entry {
        ListEntry::InnerList(l) => l.items.iter().flat_map(|i| i.params.values()).collect(),
        ListEntry::Item(_) => Vec::new(),
    };
    items
        .into_iter()
        .chain(params.values())
        .chain(inner)
        .filter_map(|b| b.as_byte_sequence().map(<[u8]>::to_vec))
        .collect()
}

/// RFC 9651 §3's sizes every parser must accept, which `sfv` does not enforce: at
/// most 1 024 members, 256 in an inner list, 256 parameters, 64 characters in a
/// parameter's key, 1 024 characters in a string, 512 in a token, 16 384 octets in a
/// byte sequence.
fn within_minimums(field: &str, shown: &str, list: &List) {
    assert!(
        list.len() <= 1024,
        "{field}: {shown:?}: more than 1 024 members"
    );
    assert!(
        within_sizes(list),
        "{field}: {shown:?}: a member past RFC 9651 §3's sizes"
    );
}

/// Whether `list` is within RFC 9651 §3's sizes (as [`within_minimums`]).
fn within_sizes(list: &List) -> bool {
    let bare_ok = |b: &BareItem| match b {
        BareItem::String(s) => s.as_str().len() <= 1024,
        BareItem::Token(t) => t.as_str().len() <= 512,
        BareItem::ByteSequence(b) => b.len() <= 16_384,
        _ => true,
    };
    let params_ok = |p: &Parameters| {
        p.len() <= 256 && p.keys().all(|k| k.as_str().len() <= 64) && p.values().all(bare_ok)
    };
    let item_ok = |i: &sfv::Item| bare_ok(&i.bare_item) && params_ok(&i.params);
    list.len() <= 1024
        && list.iter().all(|entry| match entry {
            ListEntry::Item(i) => item_ok(i),
            ListEntry::InnerList(l) => {
                l.items.len() <= 256 && l.items.iter().all(item_ok) && params_ok(&l.params)
            }
        })
}

/// Whether the choice `kept` could as well hold line `i`: swapping it for an
/// identical kept line gives the same members.
fn kept_elsewhere(parsed: &[Option<List>], kept: u32, i: usize) -> bool {
    (0..parsed.len()).any(|j| j != i && kept & 1 << j != 0 && parsed[j] == parsed[i])
}

// --- the generator ------------------------------------------------------------------

fn gen_line(u: &mut Unstructured<'_>, names: &[String]) -> AResult<Vec<u8>> {
    let mut out = Vec::new();
    let members = u.int_in_range(0..=4)?;
    for m in 0..members {
        if m > 0 {
            out.extend_from_slice(if u.ratio(7, 8)? { b", " } else { b" ,\t" });
        }
        if u.ratio(1, 6)? {
            out.push(b'(');
            // Now and then at the edge of the 256 members every parser must accept.
            let n = if out.len() < 2048 && u.ratio(1, 16)? {
                u.int_in_range(250..=260)?
            } else {
                u.int_in_range(0..=3)?
            };
            for k in 0..n {
                if k > 0 {
                    out.push(b' ');
                }
                gen_item(u, names, &mut out)?;
                gen_params(u, &mut out)?;
            }
            out.push(b')');
        } else {
            gen_item(u, names, &mut out)?;
        }
        gen_params(u, &mut out)?;
    }
    // Corruptions: a few edits at random places, from bytes the grammar cares about.
    if u.ratio(1, 3)? {
        for _ in 0..u.int_in_range(1..=3)? {
            let at = u.int_in_range(0..=out.len())?;
            const EDIT: &[u8] = b"\"\\%,;=:()? \t*-.0aAfF9@/+";
            match u.int_in_range(0..=3)? {
                0 if at < out.len() => {
                    out.remove(at);
                }
                1 if at < out.len() => out[at] = *u.choose(EDIT)?,
                2 if at < out.len() => out[at] = out[at].to_ascii_uppercase(),
                _ => out.insert(at, *u.choose(EDIT)?),
            }
        }
    }
    Ok(out)
}

/// A canonical line (as `sfv` writes it) with one of RFC 9651 §3's sizes one below,
/// at or one above its minimum: a List of 1 024 members, or of as many as the merged
/// field holds after the layer's `ours`; a byte sequence of 16 384 octets (each of the
/// three base64 paddings); a string of 1 024 characters (escapes among them); a token
/// of 512; an inner list of 256; 256 parameters; a parameter key of 64. Sometimes behind a member named like
/// the layer's (`"warn"`, the generator's names' first) or before a small one.
fn gen_edge_line(u: &mut Unstructured<'_>, ours: usize) -> AResult<Vec<u8>> {
    let delta: isize = u.int_in_range(-1..=1)?;
    let edge = |min: usize| min.saturating_add_signed(delta);
    let mut out = Vec::new();
    if u.ratio(1, 4)? {
        out.extend_from_slice(serialize(sf_string(u.choose(&NAMES)?)).as_bytes());
        out.extend_from_slice(b", ");
    }
    match u.int_in_range(0..=7)? {
        kind @ (0 | 1) => {
            let n = if kind == 0 {
                edge(1024)
            } else {
                edge(1024 - ours)
            };
            for i in 0..n {
                if i > 0 {
                    out.extend_from_slice(b", ");
                }
                out.extend_from_slice(i.to_string().as_bytes());
            }
        }
        2 => {
            let (a, b): (u8, u8) = (u.arbitrary()?, u.arbitrary()?);
            let octets = (0..edge(16_384))
                .map(|i| a.wrapping_add(b.wrapping_mul(i as u8)))
                .collect();
            out.extend_from_slice(serialize(BareItem::ByteSequence(octets)).as_bytes());
        }
        3 => {
            let pick: &[char] = u.choose(&[&['x'][..], &['"', 'y'], &['\\', ' ', 'z']])?;
            let s: std::string::String = (0..edge(1024)).map(|i| pick[i % pick.len()]).collect();
            out.extend_from_slice(
                serialize(BareItem::String(
                    sfv::String::from_string(s).unwrap_or_else(|_| unreachable!()),
                ))
                .as_bytes(),
            );
        }
        4 => {
            out.push(b'a');
            let tail = b"z09!#$%&'*+-.^_`|~:/";
            out.extend((1..edge(512)).map(|i| tail[i % tail.len()]));
        }
        5 => {
            out.push(b'(');
            for i in 0..edge(256) {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(i.to_string().as_bytes());
            }
            out.push(b')');
        }
        6 => {
            out.push(b'i');
            for i in 0..edge(256) {
                out.extend_from_slice(format!(";k{i}").as_bytes());
            }
        }
        _ => {
            // A parameter key of 64 characters, on an item or an inner list, bare
            // or with a value.
            out.extend_from_slice(if u.arbitrary()? { b"i;" } else { b"(i);" });
            let tail = b"z09_-.*";
            out.push(b'k');
            out.extend((1..edge(64)).map(|i| tail[i % tail.len()]));
            if u.arbitrary()? {
                out.extend_from_slice(b"=1");
            }
        }
    }
    if u.ratio(1, 4)? {
        out.extend_from_slice(b", 7");
    }
    Ok(out)
}

fn gen_params(u: &mut Unstructured<'_>, out: &mut Vec<u8>) -> AResult<()> {
    let n = if out.len() < 2048 && u.ratio(1, 32)? {
        u.int_in_range(250..=260)?
    } else {
        u.int_in_range(0..=2)?
    };
    for _ in 0..n {
        out.push(b';');
        out.extend_from_slice(u.choose(&[
            &b"r"[..],
            b"t",
            b"q",
            b"w",
            b"pk",
            b"*x",
            b"a-b.c_d",
        ])?);
        if u.ratio(3, 4)? {
            out.push(b'=');
            gen_bare(u, out)?;
        }
    }
    Ok(())
}

fn gen_item(u: &mut Unstructured<'_>, names: &[String], out: &mut Vec<u8>) -> AResult<()> {
    if u.ratio(1, 3)? {
        // A member named like one of the layer's.
        let name = u.choose(names)?;
        out.extend_from_slice(serialize(sf_string(name)).as_bytes());
        return Ok(());
    }
    gen_bare(u, out)
}

fn gen_bare(u: &mut Unstructured<'_>, out: &mut Vec<u8>) -> AResult<()> {
    let item = match u.int_in_range(0..=8)? {
        0 => BareItem::Integer(sfv::Integer::constant(
            u.int_in_range(-999_999_999_999_999..=999_999_999_999_999)?,
        )),
        1 => {
            let int: i64 = u.int_in_range(-999_999_999_999..=999_999_999_999)?;
            let frac: i64 = u.int_in_range(0..=999)?;
            out.extend_from_slice(format!("{int}.{frac}").as_bytes());
            return Ok(());
        }
        // Strings and tokens at the edge of the 1 024 and 512 characters every parser
        // must accept.
        2 if out.len() < 2048 && u.ratio(1, 8)? => {
            out.push(b'"');
            out.extend(std::iter::repeat_n(b'x', u.int_in_range(1020..=1026)?));
            out.push(b'"');
            return Ok(());
        }
        3 if out.len() < 2048 && u.ratio(1, 8)? => {
            out.extend(std::iter::repeat_n(b't', u.int_in_range(508..=514)?));
            return Ok(());
        }
        2 => {
            let s: String = u
                .arbitrary::<&str>()?
                .chars()
                .filter(|c| (' '..='~').contains(c))
                .collect();
            BareItem::String(sfv::String::from_string(s).unwrap_or_else(|_| unreachable!()))
        }
        3 => {
            let first = *u.choose(b"abzAZ*")?;
            let mut t = vec![first];
            for _ in 0..u.int_in_range(0..=6)? {
                t.push(*u.choose(b"az09!#$%&'*+-.^_`|~:/")?);
            }
            out.extend_from_slice(&t);
            return Ok(());
        }
        4 => BareItem::ByteSequence(u.arbitrary::<&[u8]>()?.to_vec()),
        5 => BareItem::Boolean(u.arbitrary()?),
        6 => {
            out.push(b'@');
            out.extend_from_slice(
                u.int_in_range(-999_999_999_999_999i64..=999_999_999_999_999)?
                    .to_string()
                    .as_bytes(),
            );
            return Ok(());
        }
        7 => {
            // A display string: any text, `\` and `"` and `%` among it.
            let mut s = String::new();
            for _ in 0..u.int_in_range(0..=8)? {
                s.push(*u.choose(&['a', ' ', '\\', '"', '%', 'é', '€', '😀', '~', '\u{7f}'])?);
            }
            out.extend_from_slice(b"%\"");
            for b in s.bytes() {
                if b == b'%' || b == b'"' || !(0x20..=0x7e).contains(&b) {
                    out.extend_from_slice(format!("%{b:02x}").as_bytes());
                } else {
                    out.push(b);
                }
            }
            out.push(b'"');
            return Ok(());
        }
        _ => sf_string(u.choose(&NAMES)?),
    };
    out.extend_from_slice(serialize(item).as_bytes());
    Ok(())
}

/// A bare item as `sfv` writes it.
fn serialize(item: BareItem) -> String {
    let list: List = vec![ListEntry::from(item)];
    list.serialize().expect("a one-member List serialises")
}
