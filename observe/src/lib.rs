//! What Drover's processes show operators. Every controller and agent can serve, on a separate plain-HTTP port:
//! `/metrics` in the Prometheus (OpenMetrics) text format, and on controllers a read-only web page with its
//! JSON. The port is off unless configured: it answers without credentials, so it belongs on a management
//! network, and it never accepts a change (GET and HEAD only).

pub mod http;
pub mod logging;
pub mod metrics;

pub use prometheus_client;
