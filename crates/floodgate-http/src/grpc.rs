//! gRPC answers (feature `grpc`): the layer's own answer to a gRPC request is a gRPC
//! status, not an HTTP error a gRPC client cannot read.
//!
//! A gRPC request is one whose `content-type` is `application/grpc` or
//! `application/grpc+<codec>` (`application/grpc-web*` is left to its proxy). The answer
//! is *trailers-only*: HTTP `200`, `content-type: application/grpc`, and the status in
//! the headers of a response with no body:
//!
//! | the layer's answer | `grpc-status` | retry hints |
//! |---|---|---|
//! | denied (429) | `8` `RESOURCE_EXHAUSTED` | `grpc-retry-pushback-ms` = the delay in ms (rounded up, at least 1); a `google.rpc.RetryInfo` in `grpc-status-details-bin` |
//! | can never fit | `8` `RESOURCE_EXHAUSTED` | `grpc-retry-pushback-ms: -1` ("do not retry", gRPC's retry design A6); no `RetryInfo` |
//! | no usable key (400) | `3` `INVALID_ARGUMENT` | none |
//! | limiter failed (503) | `14` `UNAVAILABLE` | none |
//!
//! `grpc-message` carries the same sentence as the HTTP body would (percent-encoded).
//! The rate-limit header families are written as for HTTP, and reach the client as
//! response metadata.

use std::time::Duration;

use floodgate::Decision;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

use crate::body::RateLimitBody;
use crate::layer::Reply;

/// `grpc-retry-pushback-ms`: how long the client's retry policy should wait.
pub(crate) static GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");

/// Whether `headers` announce a gRPC request (`application/grpc`, `application/grpc+proto`, …).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return false;
    };
    let b = value.as_bytes();
    b.get(..16)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"application/grpc"))
        && matches!(b.get(16), None | Some(b'+' | b';'))
}

/// The delay in whole milliseconds, rounded up (a retry sooner would be denied).
fn pushback_ms(delay: Duration) -> u64 {
    let nanos = delay.as_nanos();
    u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// The trailers-only gRPC response saying what `reply` says; `denial` is the denying
/// rule's decision when the answer is a denial (429 or never-fits).
pub(crate) fn respond<B>(denial: Option<&Decision>, reply: Reply) -> Response<RateLimitBody<B>> {
    let message = reply.text.trim_end();
    let (status, pushback) = match (denial, reply.status) {
        // At least 1 ms: a denied call is never told to retry at once (as HTTP's
        // Retry-After is never 0).
        (Some(d), _) => match d.retry_after().map(|w| w.max(Duration::from_millis(1))) {
            Some(delay) => (
                tonic::Status::with_error_details(
                    Code::ResourceExhausted,
                    message,
                    ErrorDetails::with_retry_info(Some(delay)),
                ),
                Some(HeaderValue::from(pushback_ms(delay))),
            ),
            None => (
                tonic::Status::new(Code::ResourceExhausted, message),
                Some(HeaderValue::from_static("-1")),
            ),
        },
        (None, StatusCode::BAD_REQUEST) => {
            (tonic::Status::new(Code::InvalidArgument, message), None)
        }
        (None, _) => (tonic::Status::new(Code::Unavailable, message), None),
    };
    let mut resp = Response::new(RateLimitBody::reply(bytes::Bytes::new()));
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    if status.add_header(headers).is_err() {
        // Only a message tonic cannot encode fails; the code alone still says it all.
        let bare = tonic::Status::new(status.code(), "");
        let _ = bare.add_header(headers);
    }
    if let Some(ms) = pushback {
        headers.insert(GRPC_RETRY_PUSHBACK_MS.clone(), ms);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_type(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn recognises_grpc_content_types_only() {
        assert!(is_grpc(&with_type("application/grpc")));
        assert!(is_grpc(&with_type("application/grpc+proto")));
        assert!(is_grpc(&with_type("Application/GRPC")));
        assert!(!is_grpc(&with_type("application/grpc-web")));
        assert!(!is_grpc(&with_type("application/json")));
        assert!(!is_grpc(&with_type("application/grp")));
        assert!(!is_grpc(&HeaderMap::new()));
    }

    #[test]
    fn pushback_rounds_up_to_the_millisecond() {
        assert_eq!(pushback_ms(Duration::from_nanos(1)), 1);
        assert_eq!(pushback_ms(Duration::from_millis(300)), 300);
        assert_eq!(pushback_ms(Duration::from_micros(1_900_001)), 1_901);
        assert_eq!(pushback_ms(Duration::ZERO), 0);
    }

    #[test]
    fn never_fits_says_do_not_retry() {
        let d = Decision::new(false, 5, 0, Duration::from_secs(1), None);
        let reply = Reply {
            status: StatusCode::TOO_MANY_REQUESTS,
            text: "never\n".into(),
        };
        let resp = respond::<()>(Some(&d), reply);
        assert_eq!(resp.status(), StatusCode::OK);
        let h = resp.headers();
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h["grpc-message"], "never");
        assert_eq!(h["grpc-retry-pushback-ms"], "-1");
        assert!(h.get("grpc-status-details-bin").is_none());
    }

    #[test]
    fn a_denial_never_says_retry_at_once() {
        // A backend may answer a denial with no wait left; HTTP says Retry-After: 1.
        let d = Decision::new(false, 5, 0, Duration::ZERO, Some(Duration::ZERO));
        let reply = Reply {
            status: StatusCode::TOO_MANY_REQUESTS,
            text: "denied\n".into(),
        };
        let resp = respond::<()>(Some(&d), reply);
        assert_eq!(resp.headers()["grpc-retry-pushback-ms"], "1");
        let status = tonic::Status::from_header_map(resp.headers()).expect("a status");
        let info = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(info.retry_delay, Some(Duration::from_millis(1)));
    }

    #[test]
    fn key_and_backend_failures_have_their_own_codes() {
        let bad = Reply {
            status: StatusCode::BAD_REQUEST,
            text: "missing key\n".into(),
        };
        assert_eq!(respond::<()>(None, bad).headers()["grpc-status"], "3");
        let down = Reply {
            status: StatusCode::SERVICE_UNAVAILABLE,
            text: "down\n".into(),
        };
        assert_eq!(respond::<()>(None, down).headers()["grpc-status"], "14");
    }
}
