//! What the layer tests share: an inner service that always answers, and Tokio's
//! clock as a limiter's clock (so a paused runtime drives both the waits and the
//! limits, and no test sleeps for real).
#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt;
use std::future::{ready, Future, Ready};
use std::task::{Context, Poll};

use floodgate::{AsyncLimit, Clock, Decision, Nanos};
use http::{Request, Response};
use tokio::time::Instant;
use tower::Service;

/// An inner service that answers every request `200 ok`, whatever its body.
#[derive(Clone)]
pub struct Hello;

impl<B> Service<Request<B>> for Hello {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(Response::new("ok".to_owned())))
    }
}

/// Tokio's clock, in nanoseconds since `start`.
#[derive(Clone, Copy)]
pub struct TokioClock {
    pub start: Instant,
}

impl Clock for TokioClock {
    fn now(&self) -> Nanos {
        Nanos::new(u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A remote limiter whose backend is down: every call fails.
pub struct Down;

/// [`Down`]'s error.
#[derive(Debug)]
pub struct Unreachable;

impl fmt::Display for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("backend unreachable")
    }
}

impl std::error::Error for Unreachable {}

impl AsyncLimit<()> for Down {
    type Error = Unreachable;

    fn check_n(
        &self,
        _: &(),
        _: u32,
    ) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Err(Unreachable))
    }

    fn peek_n(&self, _: &(), _: u32) -> impl Future<Output = Result<Decision, Unreachable>> + Send {
        ready(Err(Unreachable))
    }
}
