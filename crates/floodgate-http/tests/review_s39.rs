//! Session 39's review of `HeaderOptions::keep_service_fields`: a service line that
//! is a valid RFC 9651 List must be kept beside the layer's members.

use floodgate::{ManualClock, Policy, RateLimiter};
use floodgate_http::{Global, HeaderOptions, RateLimitLayer, Rule};
use http::{HeaderMap, HeaderValue, Request, Response};
use tower::{service_fn, Layer, Service};

/// The `RateLimit` lines of the answer to one request through a layer of one rule
/// ("global", 5 a minute) that keeps the service's fields, the service writing
/// `theirs` as its own `RateLimit` line.
async fn ratelimit_with(theirs: &'static str) -> Vec<String> {
    let limiter = RateLimiter::gcra_with_clock(Policy::per_minute(5).unwrap(), ManualClock::new());
    let layer = RateLimitLayer::builder()
        .rule(Rule::new("global", limiter, Global).unwrap())
        .headers(HeaderOptions::default().keep_service_fields(true))
        .build()
        .unwrap();
    let upstream = service_fn(move |_: Request<String>| async move {
        let mut response = Response::new(String::new());
        let h: &mut HeaderMap = response.headers_mut();
        h.insert("ratelimit", HeaderValue::from_static(theirs));
        Ok::<_, std::convert::Infallible>(response)
    });
    let response = layer
        .layer(upstream)
        .call(Request::get("/").body(String::new()).unwrap())
        .await
        .unwrap();
    response
        .headers()
        .get_all("ratelimit")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

/// A display string may hold a backslash as a plain character (RFC 9651 §3.3.8:
/// only `%` escapes there): `%"a\"` is one whole member, and `"b"` the next. The
/// layer splits the service's line as if `\` escaped the quote after it inside a
/// display string too, finds a string left open, and drops the whole valid line —
/// the service's members vanish from the response.
///
/// Finding (low: a service's own rate-limit members lost, only with
/// `keep_service_fields(true)` and a display string ending in `\`). Fixed when the
/// kept lines came to be parsed as RFC 9651 §4.2 parses a List (headers.rs); this
/// test failed on the splitter that came before.
#[tokio::test]
async fn a_display_string_ending_in_a_backslash_keeps_the_service_line() {
    assert_eq!(
        ratelimit_with(r#"%"a\";r=1, "b";r=2"#).await,
        [r#""global";r=4;t=12, %"a\";r=1, "b";r=2"#]
    );
}

/// The same members without the backslash are kept: the line above is dropped for
/// the backslash alone. Mutation seen failing it: `combine_lists` leaving every
/// service line out (`for line in theirs.iter().take(0)`).
#[tokio::test]
async fn a_display_string_member_is_kept_beside_the_layers() {
    assert_eq!(
        ratelimit_with(r#"%"a";r=1, "b";r=2"#).await,
        [r#""global";r=4;t=12, %"a";r=1, "b";r=2"#]
    );
}
