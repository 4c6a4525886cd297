//! Logs of the daemons: human-readable lines by default, one JSON object per event with `DROVER_LOG_FORMAT=json`
//! (for a log pipeline), carrying the spans an event happened in (e.g. `job` with its id and incarnation).
//! `RUST_LOG` filters as usual.

use tracing_subscriber::EnvFilter;

/// The variable that picks the format: `text` (default) or `json`.
pub const FORMAT_ENV: &str = "DROVER_LOG_FORMAT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

impl Format {
    /// `None` for anything but `text` or `json` (the daemon then says so and uses text).
    pub fn parse(value: &str) -> Option<Format> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// Installs the global subscriber on stderr; `default_filter` applies when `RUST_LOG` is unset.
pub fn init(default_filter: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let requested = std::env::var(FORMAT_ENV).unwrap_or_default();
    let format = Format::parse(&requested);
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        Some(Format::Json) => builder.json().with_current_span(true).with_span_list(true).init(),
        Some(Format::Text) | None => builder.init(),
    }
    if format.is_none() {
        tracing::warn!("{FORMAT_ENV}={requested:?} is neither text nor json; logging text");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_variable_takes_text_or_json_and_nothing_else() {
        assert_eq!(Format::parse(""), Some(Format::Text));
        assert_eq!(Format::parse("JSON"), Some(Format::Json));
        assert_eq!(Format::parse(" text "), Some(Format::Text));
        assert_eq!(Format::parse("yaml"), None);
    }
}
