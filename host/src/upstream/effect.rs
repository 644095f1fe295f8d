//! ADR-0045 as code: the outcome class of one `tools/call` attempt to an upstream, decided from
//! what the host observed (never from the upstream's opinion of itself), and whether an
//! upstream tool counts as destructive.

pub use crate::config::{Annotations, Declared, ErrorResults};

/// What one attempt showed the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// The request never left (connect refused, DNS, TLS before the request was written).
    NotSent,
    /// HTTP 404 to a request that carried an upstream session id: the session expired and the
    /// upstream refused the request before running anything.
    SessionExpired,
    /// An HTTP status other than success, before any JSON-RPC response.
    Status(u16),
    /// A JSON-RPC error response.
    RpcError { code: i64 },
    /// A `tools/call` result and its `isError`.
    Result(ResultFlag),
    /// The transport failed after the request was written (reset, timeout, a dropped stream).
    LostAfterSend,
}

/// A result's `isError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResultFlag {
    Success,
    Error,
}

/// The class of an attempt, in the lifecycle's terms (ADR-0031).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Provably nothing ran: send again under the same reservation (the only automatic
    /// resend; for an expired session, after a new session is made).
    SendAgain,
    /// The upstream answered without executing; resent only by the lifecycle's retry rules.
    Retryable,
    DefinitelyRejected,
    Accepted,
    /// The upstream may have acted.
    Unknown,
}

/// JSON-RPC's "method not found" and "invalid params": refused before execution.
const REFUSED_BEFORE_EXECUTION: [i64; 2] = [-32601, -32602];

pub fn classify(observed: Observed, errors: ErrorResults) -> Verdict {
    match observed {
        Observed::NotSent | Observed::SessionExpired => Verdict::SendAgain,
        Observed::Status(429) | Observed::Status(500..=599) => Verdict::Retryable,
        // Any other status before a JSON-RPC answer (a proxy's 403, a 400): nothing proves
        // the tool did not run on the far side of whatever answered.
        Observed::Status(_) => Verdict::Unknown,
        Observed::RpcError { code } if REFUSED_BEFORE_EXECUTION.contains(&code) => {
            Verdict::DefinitelyRejected
        }
        Observed::RpcError { .. } => Verdict::Unknown,
        Observed::Result(ResultFlag::Success) => Verdict::Accepted,
        Observed::Result(ResultFlag::Error) => match errors {
            ErrorResults::MayHaveActed => Verdict::Unknown,
            ErrorResults::AreRejections => Verdict::DefinitelyRejected,
        },
        Observed::LostAfterSend => Verdict::Unknown,
    }
}

/// The upstream's `readOnlyHint` for a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOnlyHint {
    ReadOnly,
    NotSaid,
}

/// Destructive unless proven otherwise: the operator's declaration decides; failing one, only
/// a read-only hint on a connection whose annotations the operator trusts makes a tool safe.
pub fn destructive(declared: Declared, hint: ReadOnlyHint, annotations: Annotations) -> bool {
    match (declared, hint, annotations) {
        (Declared::Destructive, _, _) => true,
        (Declared::ReadOnly, _, _) => false,
        (Declared::Nothing, ReadOnlyHint::ReadOnly, Annotations::Trusted) => false,
        (Declared::Nothing, _, _) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_of_the_adr_table() {
        let may = ErrorResults::MayHaveActed;
        let cases = [
            (Observed::NotSent, Verdict::SendAgain),
            (Observed::SessionExpired, Verdict::SendAgain),
            (Observed::Status(429), Verdict::Retryable),
            (Observed::Status(503), Verdict::Retryable),
            (Observed::Status(500), Verdict::Retryable),
            (Observed::Status(403), Verdict::Unknown),
            (Observed::Status(400), Verdict::Unknown),
            (
                Observed::RpcError { code: -32601 },
                Verdict::DefinitelyRejected,
            ),
            (
                Observed::RpcError { code: -32602 },
                Verdict::DefinitelyRejected,
            ),
            (Observed::RpcError { code: -32603 }, Verdict::Unknown),
            (Observed::RpcError { code: -32000 }, Verdict::Unknown),
            (Observed::Result(ResultFlag::Success), Verdict::Accepted),
            (Observed::Result(ResultFlag::Error), Verdict::Unknown),
            (Observed::LostAfterSend, Verdict::Unknown),
        ];
        for (observed, verdict) in cases {
            assert_eq!(classify(observed, may), verdict, "{observed:?}");
        }
        assert_eq!(
            classify(
                Observed::Result(ResultFlag::Error),
                ErrorResults::AreRejections
            ),
            Verdict::DefinitelyRejected
        );
        // The operator's word about error results never turns a lost call into a rejection.
        assert_eq!(
            classify(Observed::LostAfterSend, ErrorResults::AreRejections),
            Verdict::Unknown
        );
    }

    #[test]
    fn a_tool_is_destructive_unless_proven_otherwise() {
        use Annotations::{Trusted, Untrusted};
        use ReadOnlyHint::{NotSaid, ReadOnly as Hinted};
        // The upstream's hint alone proves nothing.
        assert!(destructive(Declared::Nothing, Hinted, Untrusted));
        assert!(destructive(Declared::Nothing, NotSaid, Trusted));
        assert!(!destructive(Declared::Nothing, Hinted, Trusted));
        // The operator's declaration wins either way.
        assert!(destructive(Declared::Destructive, Hinted, Trusted));
        assert!(!destructive(Declared::ReadOnly, NotSaid, Untrusted));
    }
}
