//! [`RateLimitBody`]: the inner service's body, or the layer's own short reply.

use core::pin::Pin;
use core::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The response body of a [`RateLimitService`](crate::RateLimitService): the inner
    /// service's body when the request went through, or a short `text/plain` reply
    /// when the layer answered (429, the never-fits status, 400, 503).
    ///
    /// # Examples
    ///
    /// ```
    /// use floodgate_http::RateLimitBody;
    /// use http_body::Body;
    /// let b: RateLimitBody<String> = RateLimitBody::reply("too many requests\n");
    /// assert_eq!(b.size_hint().exact(), Some(18));
    /// ```
    #[derive(Debug)]
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Reply { data: Option<Bytes> },
    }
}

impl<B> RateLimitBody<B> {
    /// The inner service's body, passed through.
    pub fn inner(body: B) -> RateLimitBody<B> {
        RateLimitBody {
            kind: Kind::Inner { body },
        }
    }

    /// A reply written by the layer.
    pub fn reply(text: impl Into<Bytes>) -> RateLimitBody<B> {
        let data: Bytes = text.into();
        RateLimitBody {
            kind: Kind::Reply {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for RateLimitBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Reply { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Reply { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Reply { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
