//! `GET /metrics`: counters and histograms in Prometheus' text exposition format (version
//! 0.0.4). Every number is an atomic that a request bumps without a lock; rendering reads them
//! one by one, so a scrape may see one request's counters a moment apart, as any Prometheus
//! client library allows.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The endpoints counted, in the order they are rendered; anything else counts as `other` (a
/// fixed set keeps the label's cardinality bounded whatever paths clients try).
pub const ENDPOINTS: &[&str] = &[
    "/",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/v1/models",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/api/version",
    "/api/tags",
    "/api/show",
    "/api/generate",
    "/api/chat",
    "/api/embed",
    "/api/embeddings",
    "other",
];

/// The statuses this server answers with, each with its own counter; any other is counted
/// under the last slot and rendered as `status="other"`.
const STATUSES: &[u16] = &[200, 204, 400, 401, 404, 405, 408, 413, 429, 500, 503];
const STATUS_SLOTS: usize = STATUSES.len() + 1;

/// Upper bounds in seconds: request latency runs from milliseconds (an embedding) to minutes
/// (a long generation on a CPU).
const LATENCY_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Time to first token: prefill of a short prompt is milliseconds; queueing adds seconds.
const TTFT_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// A cumulative histogram of seconds; the sum is kept in microseconds so it stays an integer
/// atomic.
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound (observations at most that bound, not cumulative) and one for +Inf.
    counts: Vec<AtomicU64>,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(), sum_us: AtomicU64::new(0) }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.bounds.iter().position(|&b| s <= b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or_else(|| "+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }
}

/// What `/metrics` reports, shared by every connection.
pub struct Metrics {
    /// `requests[endpoint * STATUS_SLOTS + status slot]`.
    requests: Vec<AtomicU64>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    pub latency: Histogram,
    pub ttft: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: (0..ENDPOINTS.len() * STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            latency: Histogram::new(LATENCY_BUCKETS),
            ttft: Histogram::new(TTFT_BUCKETS),
        }
    }
}

/// The index of `path` in [`ENDPOINTS`] (`other` for any path not served).
pub fn endpoint_index(path: &str) -> usize {
    ENDPOINTS.iter().position(|e| *e == path).unwrap_or(ENDPOINTS.len() - 1)
}

impl Metrics {
    /// One answered request (the status its headers carried).
    pub fn count_request(&self, endpoint: usize, status: u16) {
        let slot = STATUSES.iter().position(|&s| s == status).unwrap_or(STATUSES.len());
        self.requests[endpoint.min(ENDPOINTS.len() - 1) * STATUS_SLOTS + slot].fetch_add(1, Ordering::Relaxed);
    }

    /// A finished generation's token counts.
    pub fn count_tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
    }

    /// The exposition text; `running` and `queued` are the admission gauges read now.
    pub fn render(&self, running: usize, queued: usize) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP ruvllm_requests_total HTTP requests answered, by endpoint and status.\n# TYPE ruvllm_requests_total counter\n");
        for (e, endpoint) in ENDPOINTS.iter().enumerate() {
            for slot in 0..STATUS_SLOTS {
                let n = self.requests[e * STATUS_SLOTS + slot].load(Ordering::Relaxed);
                if n == 0 {
                    continue;
                }
                let status = STATUSES.get(slot).map_or_else(|| "other".to_string(), u16::to_string);
                let _ = writeln!(out, "ruvllm_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}");
            }
        }
        let counters = [
            ("ruvllm_prompt_tokens_total", "Prompt tokens of finished generations (cached ones included).", &self.prompt_tokens),
            ("ruvllm_generated_tokens_total", "Tokens generated by finished generations.", &self.generated_tokens),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Ordering::Relaxed));
        }
        let gauges = [
            ("ruvllm_requests_running", "Generation and embedding requests handed to the engine now.", running),
            ("ruvllm_requests_queued", "Requests waiting for a slot.", queued),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.latency.render(&mut out, "ruvllm_request_duration_seconds", "Time from a generation request's arrival to its last token.");
        self.ttft.render(&mut out, "ruvllm_time_to_first_token_seconds", "Time from a generation request's arrival to its first token.");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sample lines of `text` as (name with labels, value).
    fn samples(text: &str) -> Vec<(String, f64)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').expect("a sample line is 'name value'");
                (k.to_string(), v.parse().expect("a number"))
            })
            .collect()
    }

    fn value(text: &str, key: &str) -> Option<f64> {
        samples(text).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let m = Metrics::default();
        let chat = endpoint_index("/v1/chat/completions");
        m.count_request(chat, 200);
        m.count_request(chat, 200);
        m.count_request(chat, 400);
        m.count_request(endpoint_index("/nowhere"), 418);
        m.count_tokens(10, 4);
        m.latency.observe(Duration::from_millis(30));
        m.latency.observe(Duration::from_secs(1000));
        m.ttft.observe(Duration::from_millis(7));
        let text = m.render(2, 1);
        assert_eq!(value(&text, "ruvllm_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"), Some(2.0));
        assert_eq!(value(&text, "ruvllm_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"), Some(1.0));
        assert_eq!(value(&text, "ruvllm_requests_total{endpoint=\"other\",status=\"other\"}"), Some(1.0));
        assert_eq!(value(&text, "ruvllm_prompt_tokens_total"), Some(10.0));
        assert_eq!(value(&text, "ruvllm_generated_tokens_total"), Some(4.0));
        assert_eq!(value(&text, "ruvllm_requests_running"), Some(2.0));
        assert_eq!(value(&text, "ruvllm_requests_queued"), Some(1.0));
        // Buckets are cumulative; +Inf holds every observation and equals _count.
        assert_eq!(value(&text, "ruvllm_request_duration_seconds_bucket{le=\"0.025\"}"), Some(0.0));
        assert_eq!(value(&text, "ruvllm_request_duration_seconds_bucket{le=\"0.05\"}"), Some(1.0));
        assert_eq!(value(&text, "ruvllm_request_duration_seconds_bucket{le=\"300\"}"), Some(1.0));
        assert_eq!(value(&text, "ruvllm_request_duration_seconds_bucket{le=\"+Inf\"}"), Some(2.0));
        assert_eq!(value(&text, "ruvllm_request_duration_seconds_count"), Some(2.0));
        assert_eq!(value(&text, "ruvllm_request_duration_seconds_sum"), Some(1000.03));
        assert_eq!(value(&text, "ruvllm_time_to_first_token_seconds_bucket{le=\"0.01\"}"), Some(1.0));
        // Every metric has its HELP and TYPE before its samples.
        for name in ["ruvllm_requests_total", "ruvllm_request_duration_seconds", "ruvllm_requests_queued"] {
            let help = text.find(&format!("# HELP {name} ")).expect("HELP");
            let ty = text.find(&format!("# TYPE {name} ")).expect("TYPE");
            let first = text.lines().position(|l| l.starts_with(name)).expect("a sample");
            assert!(help < ty && text.lines().position(|l| l.starts_with(&format!("# TYPE {name} "))) < Some(first));
        }
    }
}
