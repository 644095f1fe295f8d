//! Names an operator gives things (workspaces, connections, keys) and what a log line may
//! carry of anything untrusted.
//!
//! One rule for every name, checked where it enters (the config file, the admin API): 1 to 64
//! of `[A-Za-z0-9._-]`, starting with a letter or digit. A name therefore never carries a
//! control character, a quote or a space into a log line, a URL or a header; the error that
//! refuses one shows at most its first 64 characters, escaped.

use std::borrow::Cow;
use std::io::Write;

pub const MAX_NAME: usize = 64;

/// Checks a name; the error says which `kind` of name and why.
pub fn check(kind: &str, name: &str) -> Result<(), String> {
    let well_formed = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if well_formed {
        Ok(())
    } else {
        Err(format!(
            "{kind} {} must be 1 to {MAX_NAME} of [A-Za-z0-9._-], starting with a letter or digit",
            shown(name)
        ))
    }
}

/// Crates whose log events are dropped whatever `OBOL_LOG` says: rmcp's client and reqwest
/// put request URLs in their messages, and an upstream's URL may carry a token in its query.
/// The gateway logs what matters of them itself, by connection id.
pub fn silenced(target: &str) -> bool {
    ["rmcp", "reqwest"]
        .iter()
        .any(|c| target == *c || target.strip_prefix(c).is_some_and(|r| r.starts_with("::")))
}

/// An untrusted string for an error message or a log line: at most 64 characters, quoted and
/// escaped (control characters as `\u{..}`).
pub fn shown(text: &str) -> String {
    let cut: String = text.chars().take(MAX_NAME).collect();
    let more = if cut.len() < text.len() { "…" } else { "" };
    format!("{cut:?}{more}")
}

/// The log's writer: a line's control characters (a forged line break, a terminal escape
/// sequence) are written escaped, never executed. Every event is written whole, ending in its
/// one newline; with colours on, the formatter's own escape sequences are kept.
pub struct LogWriter<W> {
    inner: W,
    colours: bool,
}

impl<W> LogWriter<W> {
    pub fn new(inner: W, colours: bool) -> LogWriter<W> {
        LogWriter { inner, colours }
    }
}

impl<W: Write> Write for LogWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner.write_all(&escaped(buf, self.colours))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn escaped(line: &[u8], colours: bool) -> Cow<'_, [u8]> {
    let last = line.len().saturating_sub(1);
    let harmful = |at: usize, byte: u8| {
        (byte < 0x20 || byte == 0x7f)
            && !(byte == b'\n' && at == last)
            && !(byte == 0x1b && colours)
    };
    if !line.iter().enumerate().any(|(at, &b)| harmful(at, b)) {
        return Cow::Borrowed(line);
    }
    let mut out = Vec::with_capacity(line.len() + 16);
    for (at, &byte) in line.iter().enumerate() {
        if harmful(at, byte) {
            out.extend_from_slice(format!("\\x{byte:02x}").as_bytes());
        } else {
            out.push(byte);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crates_that_log_urls_are_silenced() {
        for target in ["rmcp", "rmcp::transport::worker", "reqwest::connect"] {
            assert!(silenced(target), "{target}");
        }
        for target in ["obol::upstream", "rmcpx", "hyper_util::client"] {
            assert!(!silenced(target), "{target}");
        }
    }

    #[test]
    fn names_follow_one_rule() {
        for good in ["acme", "stripe-live", "key.1", "A_b-9", &"a".repeat(64)] {
            assert_eq!(check("key", good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "a b",
            "a\nb",
            "a\u{1b}[2J",
            "é",
            &"a".repeat(65),
            "a/b",
            "a\"b",
        ] {
            let error = check("key", bad).unwrap_err();
            assert!(
                !error.contains('\n') && !error.contains('\u{1b}'),
                "{error:?}"
            );
        }
        let long = check("key", &"x".repeat(100_000)).unwrap_err();
        assert!(long.len() < 200, "{}", long.len());
    }

    #[test]
    fn a_log_line_cannot_forge_another_or_drive_the_terminal() {
        let line = b"INFO key created name=evil\nERROR forged \x1b[2J\r end\n";
        let written = escaped(line, false);
        assert_eq!(
            written.as_ref(),
            b"INFO key created name=evil\\x0aERROR forged \\x1b[2J\\x0d end\n".as_slice()
        );
        // The formatter's colours survive when they are on; the rest is still escaped.
        let coloured = escaped(b"\x1b[32mINFO\x1b[0m a\nb\n", true);
        assert_eq!(
            coloured.as_ref(),
            b"\x1b[32mINFO\x1b[0m a\\x0ab\n".as_slice()
        );
        assert!(matches!(escaped(b"plain\n", false), Cow::Borrowed(_)));
    }
}
