//! One scrape's worth of metrics. Most of Drover's figures are read off the replicated state or Raft at scrape
//! time (queue depth, GPUs, terms), so each scrape builds a fresh registry of gauges from them; the few figures
//! that only exist as they happen (scheduling pass times, heartbeats) live in long-lived counters and histograms
//! that the scrape registers by reference.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::http::Response;

/// The content type Prometheus negotiates for the OpenMetrics text format this writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Label pairs of one series, e.g. `[("state", "RUNNING")]`.
pub type Labels = Vec<(String, String)>;

type FloatGauge = Gauge<f64, AtomicU64>;

/// Metrics of one scrape, every name prefixed `drover_`. Help texts are written as sentences; the library adds
/// the full stop, so one given here is dropped.
pub struct Exposition {
    registry: Registry,
}

impl Default for Exposition {
    fn default() -> Self {
        Exposition { registry: Registry::with_prefix("drover") }
    }
}

impl Exposition {
    /// A value read now (a term, a queue length, an age in seconds).
    pub fn gauge(&mut self, name: &str, help: &str, value: f64) {
        let gauge = FloatGauge::default();
        gauge.set(value);
        self.registry.register(name, help.trim_end_matches('.'), gauge);
    }

    /// One series per label set (an empty `rows` writes nothing: the format has no empty families).
    pub fn labelled(&mut self, name: &str, help: &str, rows: impl IntoIterator<Item = (Labels, f64)>) {
        let family = Family::<Labels, FloatGauge>::default();
        for (labels, value) in rows {
            family.get_or_create(&labels).set(value);
        }
        self.registry.register(name, help.trim_end_matches('.'), family);
    }

    /// A count that only grows for the life of the process (`_total` is appended).
    pub fn counter(&mut self, name: &str, help: &str, value: u64) {
        let counter: Counter<u64> = Counter::default();
        counter.inc_by(value);
        self.registry.register(name, help.trim_end_matches('.'), counter);
    }

    /// Counters kept per label set by the caller, e.g. per follower.
    pub fn labelled_counter(&mut self, name: &str, help: &str, rows: impl IntoIterator<Item = (Labels, u64)>) {
        let family = Family::<Labels, Counter<u64>>::default();
        for (labels, value) in rows {
            family.get_or_create(&labels).inc_by(value);
        }
        self.registry.register(name, help.trim_end_matches('.'), family);
    }

    /// A long-lived histogram (it is shared, not copied: observations keep landing in it).
    pub fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.registry.register(name, help.trim_end_matches('.'), histogram.clone());
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn into_response(self) -> Response {
        Response::ok(CONTENT_TYPE, self.text())
    }
}

/// Buckets for durations from 0.5 ms to about 16 s, doubling: scheduling passes and commits span that range.
pub fn duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.000_5, 2.0, 16))
}

/// Labels from `(name, value)` pairs.
pub fn labels<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exposition_writes_gauges_counters_families_and_histograms_in_the_openmetrics_format() {
        let passes = duration_histogram();
        passes.observe(0.003);
        let mut out = Exposition::default();
        out.gauge("raft_term", "The current Raft term.", 7.0);
        out.counter("heartbeats", "Heartbeats received.", 42);
        out.labelled(
            "jobs",
            "Jobs by state.",
            [(labels([("state", "RUNNING")]), 3.0), (labels([("state", "PENDING")]), 5.0)],
        );
        out.histogram("scheduler_pass_seconds", "Scheduling pass time.", &passes);
        let text = out.text();
        assert!(text.contains("# TYPE drover_raft_term gauge\ndrover_raft_term 7.0\n"), "{text}");
        assert!(text.contains("drover_heartbeats_total 42\n"), "{text}");
        assert!(text.contains("drover_jobs{state=\"RUNNING\"} 3.0\n"), "{text}");
        assert!(text.contains("# HELP drover_raft_term The current Raft term.\n"), "one full stop: {text}");
        assert!(text.contains("drover_scheduler_pass_seconds_count 1\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
