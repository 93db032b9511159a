//! `HeaderOptions::keep_service_fields`: the rate-limit fields an inner service writes,
//! kept and combined with the layer's by the documented rules; replaced by default.

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use floodgate::{Gcra, ManualClock, Policy, PolicyError, RateLimiter};
use floodgate_http::{Global, HeaderOptions, RateLimitLayer, Rule, Strategy};
use http::{HeaderMap, HeaderValue, Request};
use tower::{Layer, Service};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Header fields an upstream writes, in order.
type Fields = &'static [(&'static str, &'static str)];

/// A soft `warn` rule that every request exceeds (cost 2 of a burst of 1: its
/// members read `r=1;t=0`, and it is the legacy trio's pick, remaining 1; a remote
/// rule, as the builder refuses an in-process one whose cost never fits), a hard
/// `global` rule of 5 a minute, and an upstream answering `status` with `fields`; the headers of
/// the answer to one request, with the service's fields kept or not.
async fn answer(
    keep: bool,
    status: StatusCode,
    fields: Fields,
) -> Result<(StatusCode, HeaderMap), Box<dyn std::error::Error>> {
    let clock = ManualClock::new();
    let per_minute = |n| -> Result<RateLimiter<Gcra, ManualClock>, PolicyError> {
        Ok(RateLimiter::gcra_with_clock(
            Policy::per_minute(n)?,
            clock.clone(),
        ))
    };
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::remote("warn", per_minute(1)?, Global)?
                .cost(2)
                .strategy(Strategy::Soft),
        )
        .rule(Rule::new("global", per_minute(5)?, Global)?)
        .headers(HeaderOptions::default().keep_service_fields(keep))
        .build()?;
    let upstream = Router::new().route(
        "/",
        get(move || async move {
            let mut h = HeaderMap::new();
            for (name, value) in fields {
                h.append(*name, HeaderValue::from_static(value));
            }
            (status, h, "body")
        }),
    );
    let resp = layer
        .layer(upstream)
        .call(Request::get("/").body(String::new())?)
        .await?;
    Ok((resp.status(), resp.headers().clone()))
}

fn lines<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a str> {
    h.get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap_or("<bytes>"))
        .collect()
}

/// The login handler's lockout (a 429 of its own, its `RateLimit` member, its trio,
/// its `Retry-After`) passes the layer intact beside the layer's own members.
#[tokio::test]
async fn a_login_handlers_429_keeps_its_own_member_beside_the_layers() -> TestResult {
    const LOCKOUT: Fields = &[
        ("ratelimit-policy", r#""login";q=5;w=900"#),
        ("ratelimit", r#""login";r=0;t=180"#),
        ("x-ratelimit-limit", "5"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "180"),
        ("retry-after", "180"),
    ];
    let (status, h) = answer(true, StatusCode::TOO_MANY_REQUESTS, LOCKOUT).await?;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        lines(&h, "ratelimit"),
        [r#""warn";r=1;t=0, "global";r=4;t=12, "login";r=0;t=180"#]
    );
    assert_eq!(
        lines(&h, "ratelimit-policy"),
        [r#""warn";q=1, "global";q=5, "login";q=5;w=900"#]
    );
    // The service's whole trio: its remaining (0) is less than the layer's pick.
    assert_eq!(lines(&h, "x-ratelimit-limit"), ["5"]);
    assert_eq!(lines(&h, "x-ratelimit-remaining"), ["0"]);
    assert_eq!(lines(&h, "x-ratelimit-reset"), ["180"]);
    assert_eq!(lines(&h, "retry-after"), ["180"]);
    assert_eq!(lines(&h, "x-ratelimit-exceeded"), [r#""warn""#]);

    // By default the layer's fields replace the handler's (Retry-After the layer
    // does not write on a response it passes).
    let (_, h) = answer(false, StatusCode::TOO_MANY_REQUESTS, LOCKOUT).await?;
    assert_eq!(
        lines(&h, "ratelimit"),
        [r#""warn";r=1;t=0, "global";r=4;t=12"#]
    );
    assert_eq!(lines(&h, "x-ratelimit-limit"), ["1"]);
    assert_eq!(lines(&h, "x-ratelimit-remaining"), ["1"]);
    assert_eq!(lines(&h, "x-ratelimit-reset"), ["0"]);
    assert_eq!(lines(&h, "retry-after"), ["180"]);
    Ok(())
}

/// Every service line is one List with the rest; a member named like one of the
/// layer's in the same field is the layer's to describe; a line that does not split cleanly is left out
/// whole, so the combined field still parses.
#[tokio::test]
async fn service_lists_combine_without_duplicates_or_broken_lines() -> TestResult {
    const FIELDS: Fields = &[
        (
            "ratelimit",
            r#""daily, per user";r=90;t=3600, "global";r=999;t=1"#,
        ),
        ("ratelimit", r#""open;r=1"#),
        ("ratelimit", r#""burst\"x";r=2;t=1 , quota; r=3"#),
        ("ratelimit", ""),
        ("ratelimit-policy", r#""a",,"b""#),
        ("x-ratelimit-exceeded", r#""warn", "upstream""#),
    ];
    let (_, h) = answer(true, StatusCode::OK, FIELDS).await?;
    assert_eq!(
        lines(&h, "ratelimit"),
        [concat!(
            r#""warn";r=1;t=0, "global";r=4;t=12, "#,
            r#""daily, per user";r=90;t=3600, "burst\"x";r=2;t=1, quota; r=3"#
        )]
    );
    // An empty member: that line is left out.
    assert_eq!(
        lines(&h, "ratelimit-policy"),
        [r#""warn";q=1, "global";q=5"#]
    );
    assert_eq!(lines(&h, "x-ratelimit-exceeded"), [r#""warn", "upstream""#]);
    Ok(())
}

/// The legacy trio holds one limit's values: the service's whole trio when it is
/// complete, well formed and more restrictive; otherwise the layer's whole trio.
#[tokio::test]
async fn the_legacy_trio_is_never_a_mix_of_two_limits() -> TestResult {
    let trio = |h: &HeaderMap| {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .map(|n| lines(h, n).join("|"))
    };
    let layers = ["1", "1", "0"];
    let cases: [(Fields, [&str; 3]); 6] = [
        // Complete and more restrictive: the service's.
        (
            &[
                ("x-ratelimit-limit", "9"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "1700000007"),
            ],
            ["9", "0", "1700000007"],
        ),
        // A tie: the layer's.
        (
            &[
                ("x-ratelimit-limit", "9"),
                ("x-ratelimit-remaining", "1"),
                ("x-ratelimit-reset", "7"),
            ],
            layers,
        ),
        // A part of a trio (its remaining 0 beside the layer's limit would read as
        // one limit): the layer's whole trio.
        (
            &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "7")],
            layers,
        ),
        // Not an integer.
        (
            &[
                ("x-ratelimit-limit", "9x"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "7"),
            ],
            layers,
        ),
        // A field twice.
        (
            &[
                ("x-ratelimit-limit", "9"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-remaining", "0"),
                ("x-ratelimit-reset", "7"),
            ],
            layers,
        ),
        // More integer than a Structured Field holds.
        (
            &[
                ("x-ratelimit-limit", "9"),
                ("x-ratelimit-remaining", "0000000000000000"),
                ("x-ratelimit-reset", "7"),
            ],
            layers,
        ),
    ];
    for (n, (fields, expected)) in cases.into_iter().enumerate() {
        let (_, h) = answer(true, StatusCode::OK, fields).await?;
        assert_eq!(trio(&h), expected, "case {n}");
    }
    Ok(())
}

/// A service line whose members split at the commas but are not RFC 9651 List
/// members (a space before a parameter, an upper-case key, a space inside a token,
/// too many decimal digits, a bad escape or tab in a string, an inner list without
/// its space) is left out whole: one such member would make a client's parser
/// refuse the whole combined field, the layer's own members with it.
#[tokio::test]
async fn a_service_member_that_is_not_structured_field_syntax_is_left_out() -> TestResult {
    const FIELDS: Fields = &[
        ("ratelimit", r#""login";r=0;t=180"#),
        ("ratelimit", r#""x" ;r=1"#),
        ("ratelimit", r#""x";R=1"#),
        ("ratelimit", "bad token;r=1"),
        ("ratelimit", "a;r=1.2345"),
        ("ratelimit", r#""a\q";r=1"#),
        ("ratelimit", "\"a\tb\";r=1"),
        ("ratelimit", "(a b)c"),
        ("ratelimit", "-;r=1"),
        (
            "ratelimit",
            r#"(a  "b");q=1, ?1, @17, :AQ==:, %"caf%c3%a9", *t/x:y;k, -1.5"#,
        ),
    ];
    let (_, h) = answer(true, StatusCode::OK, FIELDS).await?;
    assert_eq!(
        lines(&h, "ratelimit"),
        [concat!(
            r#""warn";r=1;t=0, "global";r=4;t=12, "login";r=0;t=180, "#,
            r#"(a  "b");q=1, ?1, @17, :AQ==:, %"caf%c3%a9", *t/x:y;k, -1.5"#
        )]
    );
    Ok(())
}

/// Each kind of bare item is kept only as every RFC 9651 parser reads it (§4.2): a
/// display string's escapes are two lower-case hex digits and decode to UTF-8; a
/// byte sequence is base64 with its padding and zero unused bits; a date is an
/// integer; an integer has at most 15 digits, a decimal at most 12 before its dot
/// and 3 after. A line with one member that is not is left out whole, its other
/// members with it.
#[tokio::test]
async fn each_kind_of_item_is_kept_only_as_every_parser_reads_it() -> TestResult {
    // One line each, kept in order.
    const KEPT: &[&str] = &[
        r#"%"caf%c3%a9", %"", %"%f0%9f%98%80 %22q%22 a\b 100%25""#,
        "::, :Zg==:, :Zm8=:, :Zm9v:, :Zm9vYg==:, ://79:",
        "@0, @-62135596800, @999999999999999",
        "0, -0, 999999999999999, -999999999999999",
        "1.0, -0.5, 999999999999.999, -999999999999.999",
    ];
    // A valid member, then one that is not: each line is left out whole.
    const LEFT_OUT: &[&str] = &[
        // Display strings: upper-case hex, one hex digit, no hex, a UTF-8
        // sequence cut short, a byte no UTF-8 has, an overlong form, a surrogate.
        r#"lost, %"caf%C3%A9""#,
        r#"lost, %"a%2""#,
        r#"lost, %"a%zz""#,
        r#"lost, %"caf%c3""#,
        r#"lost, %"%ff""#,
        r#"lost, %"%c0%af""#,
        r#"lost, %"%ed%a0%80""#,
        // Byte sequences: unpadded, padding short, unused bits set, padding where
        // no character is missing, a character outside the alphabet.
        "lost, :Zg:",
        "lost, :Zg=:",
        "lost, :Zh==:",
        "lost, :Zm9=:",
        "lost, :Zm9v=:",
        "lost, :Zm9v*A==:",
        // Dates: a decimal, no digits, 16 digits.
        "lost, @1.5",
        "lost, @",
        "lost, @1000000000000000",
        // Integers and decimals: 16 digits, a sign alone, 13 digits before the
        // dot, 4 after, none after, none before, two dots.
        "lost, 1000000000000000",
        "lost, -",
        "lost, 1234567890123.5",
        "lost, 1.2345",
        "lost, 1.",
        "lost, .5",
        "lost, 1.2.3",
    ];
    const FIELDS: Fields = &[
        ("ratelimit", KEPT[0]),
        ("ratelimit", LEFT_OUT[0]),
        ("ratelimit", LEFT_OUT[1]),
        ("ratelimit", LEFT_OUT[2]),
        ("ratelimit", LEFT_OUT[3]),
        ("ratelimit", LEFT_OUT[4]),
        ("ratelimit", LEFT_OUT[5]),
        ("ratelimit", LEFT_OUT[6]),
        ("ratelimit", KEPT[1]),
        ("ratelimit", LEFT_OUT[7]),
        ("ratelimit", LEFT_OUT[8]),
        ("ratelimit", LEFT_OUT[9]),
        ("ratelimit", LEFT_OUT[10]),
        ("ratelimit", LEFT_OUT[11]),
        ("ratelimit", LEFT_OUT[12]),
        ("ratelimit", KEPT[2]),
        ("ratelimit", LEFT_OUT[13]),
        ("ratelimit", LEFT_OUT[14]),
        ("ratelimit", LEFT_OUT[15]),
        ("ratelimit", KEPT[3]),
        ("ratelimit", LEFT_OUT[16]),
        ("ratelimit", LEFT_OUT[17]),
        ("ratelimit", KEPT[4]),
        ("ratelimit", LEFT_OUT[18]),
        ("ratelimit", LEFT_OUT[19]),
        ("ratelimit", LEFT_OUT[20]),
        ("ratelimit", LEFT_OUT[21]),
        ("ratelimit", LEFT_OUT[22]),
    ];
    assert_eq!(FIELDS.len(), KEPT.len() + LEFT_OUT.len());
    let (_, h) = answer(true, StatusCode::OK, FIELDS).await?;
    let expected = format!(r#""warn";r=1;t=0, "global";r=4;t=12, {}"#, KEPT.join(", "));
    assert_eq!(lines(&h, "ratelimit"), [expected.as_str()]);
    Ok(())
}

/// A service line with spaces and tabs at its edges (which HTTP leaves out of a
/// field value, but `HeaderValue` keeps) is kept, its member copied without them:
/// found by the `service_fields` fuzz target, whose oracle (a parser that, as RFC
/// 9651 §4.2 reads, discards leading spaces only) refused the tab-edged line.
#[tokio::test]
async fn a_line_with_tabs_at_its_edges_is_kept_without_them() -> TestResult {
    let (_, alone) = answer(true, StatusCode::OK, &[]).await?;
    let ours = lines(&alone, "ratelimit");
    let (_, h) = answer(
        true,
        StatusCode::OK,
        &[("ratelimit", "\t \"tabbed\";r=1, (1 2) \t")],
    )
    .await?;
    assert_eq!(
        lines(&h, "ratelimit"),
        [format!(r#"{}, "tabbed";r=1, (1 2)"#, ours[0])]
    );
    Ok(())
}
