//! A response read whole over a real connection: status, headers and a UTF-8 body.

use http::{HeaderMap, Response, StatusCode};
use http_body_util::BodyExt;

/// What a test client got back.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    /// Reads `response` to its end.
    pub async fn read<B>(
        response: Response<B>,
    ) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>>
    where
        B: http_body::Body,
        B::Error: std::error::Error + Send + Sync + 'static,
    {
        let (head, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Answer {
            status: head.status,
            headers: head.headers,
            body: String::from_utf8(body.to_vec())?,
        })
    }

    /// The value of header `name`, if it is there and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}
