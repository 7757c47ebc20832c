//! What `/metrics` reports (Prometheus' text format, through `prometheus-client`) and
//! `/health` sums up: responses by route and status, the queue and the requests in
//! flight, tokens, time to first token and decode speed, and DFlash's acceptance.

use dflash_engine::Answer;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

/// A response's labels: the route it matched (`other` for none) and its status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct Response {
    pub route: String,
    pub status: u16,
}

pub(super) struct Metrics {
    registry: Registry,
    pub responses: Family<Response, Counter>,
    /// Generations answered whole (or streamed to their end).
    pub served: Counter,
    /// Requests whose client left before the answer ended (their generation stopped).
    pub hangups: Counter,
    /// Requests refused because the queue was full (429) or the server was stopping (503).
    pub rejected: Counter,
    /// Requests the engine failed (its error, or a panic).
    pub failed: Counter,
    pub queue_depth: Gauge,
    pub in_flight: Gauge,
    pub connections: Gauge,
    pub connections_opened: Counter,
    pub prompt_tokens: Counter,
    pub completion_tokens: Counter,
    /// From the request's arrival (its wait in the queue included) to its first token.
    pub time_to_first_token: Histogram,
    /// Each answer's decode speed (tokens after the first over the decode time).
    pub decode_tokens_per_second: Histogram,
    pub dflash_steps: Counter,
    pub dflash_accepted_tokens: Counter,
}

impl Metrics {
    pub(super) fn new() -> Self {
        let m = Metrics {
            registry: Registry::with_prefix("dflash"),
            responses: Family::default(),
            served: Counter::default(),
            hangups: Counter::default(),
            rejected: Counter::default(),
            failed: Counter::default(),
            queue_depth: Gauge::default(),
            in_flight: Gauge::default(),
            connections: Gauge::default(),
            connections_opened: Counter::default(),
            prompt_tokens: Counter::default(),
            completion_tokens: Counter::default(),
            time_to_first_token: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            decode_tokens_per_second: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            dflash_steps: Counter::default(),
            dflash_accepted_tokens: Counter::default(),
        };
        m.register()
    }

    fn register(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "http_responses",
            "HTTP responses by route and status",
            self.responses.clone(),
        );
        r.register(
            "requests_served",
            "Generations answered to their end",
            self.served.clone(),
        );
        r.register(
            "requests_hung_up",
            "Generations stopped because their client left",
            self.hangups.clone(),
        );
        r.register(
            "requests_rejected",
            "Requests refused with 429 (queue full) or 503 (stopping)",
            self.rejected.clone(),
        );
        r.register(
            "requests_failed",
            "Requests the engine failed",
            self.failed.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting for the engine",
            self.queue_depth.clone(),
        );
        r.register(
            "requests_in_flight",
            "Requests queued or running",
            self.in_flight.clone(),
        );
        r.register(
            "connections",
            "Open HTTP connections",
            self.connections.clone(),
        );
        r.register(
            "connections_opened",
            "HTTP connections accepted (requests over kept-alive ones share one)",
            self.connections_opened.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens processed",
            self.prompt_tokens.clone(),
        );
        r.register(
            "completion_tokens",
            "Completion tokens generated",
            self.completion_tokens.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "From a request's arrival (queue included) to its first token",
            self.time_to_first_token.clone(),
        );
        r.register(
            "decode_tokens_per_second",
            "Each answer's decode speed",
            self.decode_tokens_per_second.clone(),
        );
        r.register(
            "draft_steps",
            "DFlash draft-and-verify steps",
            self.dflash_steps.clone(),
        );
        r.register(
            "draft_accepted_tokens",
            "Drafted tokens the target accepted (tokens per step = 1 + accepted / steps)",
            self.dflash_accepted_tokens.clone(),
        );
        self
    }

    /// The figures of a finished answer.
    pub(super) fn answered(&self, a: &Answer) {
        let u = &a.usage;
        let count = |v: &Value| v.as_u64().unwrap_or(0);
        self.prompt_tokens.inc_by(count(&u["prompt_tokens"]));
        let completion = count(&u["completion_tokens"]);
        self.completion_tokens.inc_by(completion);
        if completion >= 2 {
            let rate = u["decode_tok_s"].as_f64().unwrap_or(0.0);
            self.decode_tokens_per_second.observe(rate);
        }
        if let Some(d) = a.dflash() {
            self.dflash_steps.inc_by(count(&d["steps"]));
            self.dflash_accepted_tokens
                .inc_by(count(&d["accepted_tokens"]));
        }
    }

    /// Prometheus' text (OpenMetrics) of every metric.
    pub(super) fn text(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The request counts `/health` reports.
    pub(super) fn requests(&self) -> Value {
        json!({
            "served": self.served.get(),
            "interrupted": self.hangups.get(),
            "rejected": self.rejected.get(),
            "failed": self.failed.get(),
            "queued": self.queue_depth.get(),
            "in_flight": self.in_flight.get(),
        })
    }
}
