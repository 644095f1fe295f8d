//! W3C Trace Context: the client's `traceparent` (in a request's `_meta`), read so that a
//! receipt can be found from the client's trace. A malformed value is ignored, as the
//! recommendation says a receiver must, and counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// A trace id (32 lowercase hex digits, not all zero), with the client's span it came from
/// (16 hex digits), so the gateway's spans can continue the client's trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceId {
    trace: String,
    parent: String,
}

impl TraceId {
    pub fn as_str(&self) -> &str {
        &self.trace
    }

    /// The client's span: the parent of the gateway's.
    pub fn parent_span(&self) -> &str {
        &self.parent
    }

    pub fn into_string(self) -> String {
        self.trace
    }
}

/// `traceparent` values that were present but malformed, since the process started.
pub static MALFORMED: AtomicU64 = AtomicU64::new(0);

/// The trace id of a `traceparent` (`version-traceid-parentid-flags`), or `None` when there
/// is none or it is malformed (then counted in [`MALFORMED`]).
pub fn trace_id(traceparent: Option<&serde_json::Value>) -> Option<TraceId> {
    let value = traceparent?;
    let parsed = value.as_str().and_then(parse);
    if parsed.is_none() {
        let seen = MALFORMED.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::debug!(
            malformed_traceparents = seen,
            "a malformed traceparent was ignored"
        );
    }
    parsed
}

fn parse(text: &str) -> Option<TraceId> {
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = text.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let rest = parts.next();
    // Version 00 has exactly four fields; a later version may add fields after them.
    if !hex(version, 2) || version == "ff" || (version == "00" && rest.is_some()) {
        return None;
    }
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if !hex(trace, 32) || zero(trace) || !hex(parent, 16) || zero(parent) || !hex(flags, 2) {
        return None;
    }
    Some(TraceId {
        trace: trace.to_owned(),
        parent: parent.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn well_formed_values_give_their_trace_id_and_others_nothing() {
        let good = json!("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01");
        assert_eq!(
            trace_id(Some(&good)).unwrap().as_str(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        // A later version may carry more fields.
        let later = json!("01-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01-extra");
        assert!(trace_id(Some(&later)).is_some());
        let before = MALFORMED.load(Ordering::Relaxed);
        for bad in [
            json!("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01-extra"),
            json!("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
            json!("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01"),
            json!("ff-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"),
            json!("00-0AF7651916CD43DD8448EB211C80319C-00f067aa0ba902b7-01"),
            json!("00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7"),
            json!(42),
            json!("not a traceparent"),
        ] {
            assert_eq!(trace_id(Some(&bad)), None, "{bad}");
        }
        assert!(MALFORMED.load(Ordering::Relaxed) >= before + 8);
        assert_eq!(trace_id(None), None);
    }
}
