//! The request log line (api.md: one per request at the default level, with method, route,
//! status, bytes, milliseconds and namespace), written by the server binary straight to its
//! log writer.
//!
//! The line, sent as a `tracing` event through `tracing-appender`, cost a capped read about a
//! tenth of its CPU (docs/benchmarks.md). Of what a profile shows of it, most was the event
//! itself: the filter and the subscriber's layers, then its fields one by one through `dyn`
//! visitors. Made here, and handed to [`logwriter`](crate::http::logwriter) rather than a channel,
//! a read's CPU went to 0.93 of what it was. So the binary [`install`]s the writer its
//! subscriber writes to, with the subscriber's format, and the line is then made here in one
//! step. It holds the same bytes as the subscriber's formatter makes of the event it replaces
//! (the tests below put the two side by side, in both formats), and it is written only where
//! that event would be enabled (`RUST_LOG`, by target and level; a filter on the event's field
//! values is not consulted).
//! Where nothing is installed (the library in tests, or colours on a terminal), the event goes
//! through `tracing` as before.

use std::cell::RefCell;
use std::io::Write;
use std::sync::OnceLock;

use crate::http::logwriter::BatchedWriter;

/// What one request's line says.
pub(crate) struct RequestLine<'a> {
    pub method: &'a str,
    pub route: &'a str,
    pub status: u16,
    /// The body's length when it is known in advance (not for streamed bodies).
    pub bytes: Option<u64>,
    pub elapsed: std::time::Duration,
    pub namespace: &'a str,
}

/// The log format the subscriber was set up with (`--log-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `tracing_subscriber::fmt`'s default, without colours.
    Text,
    /// `tracing_subscriber::fmt().json().with_current_span(false)`.
    Json,
}

struct Installed {
    writer: BatchedWriter,
    format: Format,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();

/// From now on, request lines go to `writer` (the one the subscriber writes to) in `format`.
/// The first call wins.
pub fn install(writer: BatchedWriter, format: Format) {
    let _ = INSTALLED.set(Installed { writer, format });
}

/// Logs one request's line, when the filter lets it through.
pub(crate) fn log(line: &RequestLine<'_>) {
    if !tracing::enabled!(target: "spillway::http", tracing::Level::INFO) {
        return;
    }
    let Some(to) = INSTALLED.get() else {
        return through_tracing(line);
    };
    thread_local! {
        static BUF: RefCell<String> = const { RefCell::new(String::new()) };
    }
    BUF.with_borrow_mut(|buf| {
        buf.clear();
        now(buf);
        format(buf, to.format, line);
        // As the subscriber does with a line it cannot write: nowhere to say so.
        let _ = (&to.writer).write_all(buf.as_bytes());
    });
}

/// The time as the subscriber's default timer writes it.
fn now(buf: &mut String) {
    use tracing_subscriber::fmt::time::FormatTime;
    let _ =
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut tracing_subscriber::fmt::format::Writer::new(buf));
}

/// The event this line stands for: how it is logged where nothing is installed, and what the
/// tests compare the line with.
fn through_tracing(line: &RequestLine<'_>) {
    tracing::info!(
        target: "spillway::http",
        method = %line.method,
        route = %line.route,
        status = line.status,
        bytes = line.bytes,
        ms = format_args!("{:.1}", line.elapsed.as_secs_f64() * 1000.0),
        namespace = line.namespace,
        "request"
    );
}

/// Appends the line after its timestamp (already in `buf`), with its newline.
fn format(buf: &mut String, format: Format, l: &RequestLine<'_>) {
    use std::fmt::Write as _;
    let ms = l.elapsed.as_secs_f64() * 1000.0;
    match format {
        Format::Text => {
            let _ =
                write!(buf, "  INFO spillway::http: request method={} route={} status={}", l.method, l.route, l.status);
            if let Some(bytes) = l.bytes {
                let _ = write!(buf, " bytes={bytes}");
            }
            let _ = writeln!(buf, " ms={ms:.1} namespace={:?}", l.namespace);
        }
        Format::Json => {
            #[derive(serde::Serialize)]
            struct Fields<'a> {
                message: &'static str,
                method: &'a str,
                route: &'a str,
                status: u16,
                #[serde(skip_serializing_if = "Option::is_none")]
                bytes: Option<u64>,
                ms: &'a str,
                namespace: &'a str,
            }
            #[derive(serde::Serialize)]
            struct Line<'a> {
                timestamp: &'a str,
                level: &'static str,
                fields: Fields<'a>,
                target: &'static str,
            }
            let timestamp = std::mem::take(buf);
            let ms = format!("{ms:.1}");
            let fields = Fields {
                message: "request",
                method: l.method,
                route: l.route,
                status: l.status,
                bytes: l.bytes,
                ms: &ms,
                namespace: l.namespace,
            };
            let line = Line { timestamp: &timestamp, level: "INFO", fields, target: "spillway::http" };
            let mut out = serde_json::to_vec(&line).unwrap_or_default();
            out.push(b'\n');
            *buf = String::from_utf8(out).unwrap_or_default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::logwriter::tests::Kept;

    /// One timestamp for both sides.
    struct Fixed;

    impl tracing_subscriber::fmt::time::FormatTime for Fixed {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            w.write_str("2026-12-07T03:04:05.678901Z")
        }
    }

    /// The subscriber's line for `line`, set up as `main.rs` sets it up in `format`.
    fn subscribers_line(format: Format, line: &RequestLine<'_>) -> String {
        let kept = Kept::default();
        let writer = {
            let kept = kept.clone();
            move || kept.clone()
        };
        let builder = tracing_subscriber::fmt().with_writer(writer).with_timer(Fixed).with_ansi(false);
        match format {
            Format::Text => tracing::subscriber::with_default(builder.finish(), || through_tracing(line)),
            Format::Json => tracing::subscriber::with_default(builder.json().with_current_span(false).finish(), || {
                through_tracing(line)
            }),
        }
        let bytes = kept.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn ours(format: Format, line: &RequestLine<'_>) -> String {
        let mut buf = "2026-12-07T03:04:05.678901Z".to_owned();
        super::format(&mut buf, format, line);
        buf
    }

    /// Byte for byte the subscriber's line, in both formats, with and without a length, for
    /// namespaces and routes with characters that need escaping in either format.
    #[test]
    fn the_line_is_the_subscribers_line() {
        let ms = std::time::Duration::from_micros;
        let lines = [
            RequestLine {
                method: "GET",
                route: "/v1/blobs/{digest}/read",
                status: 200,
                bytes: Some(103_333),
                elapsed: ms(44),
                namespace: "default",
            },
            RequestLine {
                method: "PUT",
                route: "/v1/blobs/{digest}",
                status: 201,
                bytes: None,
                elapsed: ms(1_234_567),
                namespace: "-",
            },
            RequestLine {
                method: "other",
                route: "/v1/\"odd\"\\route",
                status: 404,
                bytes: Some(0),
                elapsed: ms(50),
                namespace: "team\"a\\b\u{7f}\tč",
            },
        ];
        for format in [Format::Text, Format::Json] {
            for line in &lines {
                let theirs = subscribers_line(format, line);
                assert!(theirs.ends_with('\n') && theirs.contains("request"), "{theirs:?}");
                assert_eq!(ours(format, line), theirs, "{format:?}");
            }
        }
    }
}
