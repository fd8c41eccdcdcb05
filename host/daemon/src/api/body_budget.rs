//! One budget of request-body bytes shared by every request (`max-buffered-request-bytes`), so
//! many concurrent large produces cannot grow the daemon's memory without bound: a request that
//! does not fit is answered `503` with `Retry-After` instead of being buffered.
//!
//! How bytes are counted, in [`limit_bodies`] (a middleware around every route):
//! - a request with `Content-Length` reserves that many bytes before its body is read (capped at
//!   the largest per-request limit, since no extractor reads further). When they do not fit it
//!   is answered 503 at once, without reading the body, so a client sending
//!   `Expect: 100-continue` does not even upload it; its body is then read and thrown away in
//!   the background, which costs no memory and leaves the client a clean answer and a
//!   reusable connection;
//! - a request without a length (chunked) is charged chunk by chunk as its body arrives; when a
//!   chunk does not fit, reading stops and the request is answered 503;
//! - a request larger than the whole budget could never fit: it is answered 413, like one over
//!   `max-request-bytes`, never 503 (a retry would fail the same way);
//! - the bytes stay counted until the request's answer is ready, because the decoded records
//!   live as long as the handler and take about as much memory as the body.
//!
//! The budget bounds body buffers, not every allocation a request makes: JSON decoding and
//! base64 keep a copy of similar size while the handler runs, so the peak memory of request
//! handling is a small multiple of the budget, independent of the number of clients.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_LENGTH, EXPECT, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Body as _, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::error::ApiError;

/// Seconds a client refused for the body budget is asked to wait (`Retry-After`): the budget
/// frees as soon as the requests holding it are answered, typically well within a second.
pub(crate) const RETRY_AFTER_SECS: u64 = 1;

/// The shared budget.
#[derive(Debug)]
pub(crate) struct BodyBudget {
    /// The setting that gives `total`, named in refusals.
    setting: &'static str,
    /// Most bytes held at once.
    total: u64,
    /// The largest body any route reads (max of max-request-bytes and max-plugin-bytes): bytes
    /// past it are never buffered, so they are never counted.
    ceiling: u64,
    /// Bytes held now.
    used: AtomicU64,
    /// `narad_http_buffered_request_bytes`.
    gauge: Gauge<u64, AtomicU64>,
    /// `narad_http_body_budget_refusals_total`.
    refusals: Counter,
}

impl BodyBudget {
    /// A budget of `total` bytes (the value of `setting`) for bodies no route reads past
    /// `ceiling` bytes of, reporting into `gauge` (bytes held) and `refusals` (503 answers).
    pub(crate) fn new(
        setting: &'static str,
        total: u64,
        ceiling: u64,
        gauge: Gauge<u64, AtomicU64>,
        refusals: Counter,
    ) -> BodyBudget {
        BodyBudget {
            setting,
            total,
            ceiling,
            used: AtomicU64::new(0),
            gauge,
            refusals,
        }
    }

    /// Takes `n` bytes if they fit.
    fn try_take(&self, n: u64) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|after| *after <= self.total)
            });
        match taken {
            Ok(before) => {
                self.gauge.set(before + n);
                true
            }
            Err(_) => false,
        }
    }

    fn give_back(&self, n: u64) {
        if n == 0 {
            return;
        }
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        self.gauge.set(before.saturating_sub(n));
    }

    /// Bytes held now.
    #[cfg(test)]
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

const FITS: u8 = 0;
const EXHAUSTED: u8 = 1;
const TOO_LARGE: u8 = 2;

/// The bytes one request holds, given back when the last of the middleware and the body
/// wrapper lets go.
struct Held {
    budget: Arc<BodyBudget>,
    bytes: AtomicU64,
    outcome: AtomicU8,
}

impl Held {
    fn take(&self, n: u64) -> bool {
        if self.budget.try_take(n) {
            self.bytes.fetch_add(n, Ordering::AcqRel);
            true
        } else {
            false
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.give_back(*self.bytes.get_mut());
    }
}

/// The error a charged body ends with when its next chunk does not fit; the middleware turns
/// the answer into a 503 or 413.
#[derive(Debug, thiserror::Error)]
#[error("request body does not fit in the daemon's buffered-request budget")]
struct OverBudget;

/// A request body that charges the budget for every byte past its reservation.
struct Charged {
    inner: Body,
    held: Arc<Held>,
    /// Bytes of this body seen so far.
    seen: u64,
    /// Bytes of this body counted so far (the reservation, then what chunks added).
    counted: u64,
}

impl http_body::Body for Charged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let this = &mut *self;
            this.seen = this.seen.saturating_add(data.len() as u64);
            let upto = this.seen.min(this.held.budget.ceiling);
            if upto > this.counted {
                let outcome = if upto > this.held.budget.total {
                    Some(TOO_LARGE)
                } else if this.held.take(upto - this.counted) {
                    this.counted = upto;
                    None
                } else {
                    Some(EXHAUSTED)
                };
                if let Some(outcome) = outcome {
                    this.held.outcome.store(outcome, Ordering::Release);
                    return Poll::Ready(Some(Err(axum::Error::new(OverBudget))));
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware: counts every request body against the shared budget (see the module doc).
pub(crate) async fn limit_bodies(
    State(budget): State<Arc<BodyBudget>>,
    req: Request,
    next: Next,
) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let held = Arc::new(Held {
        budget: Arc::clone(&budget),
        bytes: AtomicU64::new(0),
        outcome: AtomicU8::new(FITS),
    });
    let mut counted = 0;
    if let Some(len) = declared {
        let need = len.min(budget.ceiling);
        let refusal = if need > budget.total {
            Some(TOO_LARGE)
        } else if held.take(need) {
            counted = need;
            None
        } else {
            Some(EXHAUSTED)
        };
        if let Some(outcome) = refusal {
            // The body is not buffered: read it to its end and drop it, so the client (still
            // sending) gets the answer instead of a reset connection. Not when the client waits
            // for `100 Continue`: reading would send it, and the client has sent nothing yet.
            let expects_continue = req.headers().contains_key(EXPECT);
            if len <= budget.ceiling && !expects_continue {
                discard(req.into_body());
            }
            return refusal_answer(&budget, outcome);
        }
    }
    let req = req.map(|inner| {
        Body::new(Charged {
            inner,
            held: Arc::clone(&held),
            seen: 0,
            counted,
        })
    });
    let response = next.run(req).await;
    match held.outcome.load(Ordering::Acquire) {
        FITS => response,
        outcome => refusal_answer(&budget, outcome),
    }
}

/// The 503 (budget full now) or 413 (larger than the whole budget) answer.
fn refusal_answer(budget: &BodyBudget, outcome: u8) -> Response {
    if outcome == TOO_LARGE {
        return ApiError::too_large(format!(
            "request body is larger than the daemon's whole buffered-request budget of {} bytes \
             ({}); send fewer records per request",
            budget.total, budget.setting
        ))
        .into_response();
    }
    budget.refusals.inc();
    let mut response = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "the daemon is buffering as many request bodies as it may ({} bytes, {}); retry \
             after {RETRY_AFTER_SECS} s",
            budget.total, budget.setting
        ),
    )
    .into_response();
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

/// Reads a refused body to its end in the background, keeping none of it. Ends when the body
/// does, or when the connection closes (idle timeout, shutdown).
fn discard(mut body: Body) {
    tokio::spawn(async move {
        while let Some(Ok(_)) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(total: u64) -> Arc<BodyBudget> {
        Arc::new(BodyBudget::new(
            "max-buffered-request-bytes",
            total,
            total * 4,
            Gauge::default(),
            Counter::default(),
        ))
    }

    #[test]
    fn bytes_are_given_back_when_the_request_lets_go() {
        let b = budget(100);
        let held = Held {
            budget: Arc::clone(&b),
            bytes: AtomicU64::new(0),
            outcome: AtomicU8::new(FITS),
        };
        assert!(held.take(60));
        assert!(!b.try_take(41));
        assert!(b.try_take(40));
        b.give_back(40);
        drop(held);
        assert_eq!(b.used(), 0);
        assert!(b.try_take(100));
    }
}
