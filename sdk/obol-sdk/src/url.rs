//! Building request URLs from the connection's base URL without a URL crate.
//!
//! Only the values that come from a call are encoded: fixed path parts are the author's
//! text, while segments and query values may hold anything an agent typed, including `/`,
//! `?` or `#`, which must not change the URL's structure.

use std::fmt::{Display, Write};

use crate::error::PrepareError;

/// Percent-encodes everything but RFC 3986 unreserved characters (`A-Z a-z 0-9 - . _ ~`),
/// so the result is safe as a path segment, a query name or value, or a form field.
pub fn percent_encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// A URL under a base, e.g. `UrlBuilder::new(base).path("v1/charges").query("limit", 10)`.
///
/// Path parts and query pairs may be added in any order; the query always ends up last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UrlBuilder {
    path: String,
    query: String,
    /// The first segment that would change the path's structure; reported by `build`.
    bad_segment: Option<String>,
}

impl UrlBuilder {
    /// Starts at `base` (usually [`ConnectionFacts::base_url`](crate::ConnectionFacts)); a
    /// trailing `/` is dropped so that `path` and `segment` never produce `//`.
    pub fn new(base: &str) -> UrlBuilder {
        UrlBuilder {
            path: base.trim_end_matches('/').to_owned(),
            query: String::new(),
            bad_segment: None,
        }
    }

    /// Appends fixed path text such as `v1/refunds` as written, without encoding: use it for
    /// the author's constants, never for call values.
    pub fn path(mut self, fixed: &str) -> UrlBuilder {
        let fixed = fixed.trim_matches('/');
        if !fixed.is_empty() {
            self.path.push('/');
            self.path.push_str(fixed);
        }
        self
    }

    /// Appends one percent-encoded path segment: `/` in the value stays inside the segment.
    ///
    /// An empty, `.` or `..` value makes [`UrlBuilder::build`] fail instead: URL parsers
    /// resolve dot segments even when percent-encoded, so `..` would climb out of the
    /// connection's base path.
    pub fn segment(mut self, value: impl Display) -> UrlBuilder {
        let value = value.to_string();
        if matches!(value.as_str(), "" | "." | "..") {
            self.bad_segment.get_or_insert(value);
        } else {
            self.path.push('/');
            self.path.push_str(&percent_encode(&value));
        }
        self
    }

    /// Appends `name=value`, both percent-encoded.
    pub fn query(mut self, name: &str, value: impl Display) -> UrlBuilder {
        self.query
            .push(if self.query.is_empty() { '?' } else { '&' });
        self.query.push_str(&percent_encode(name));
        self.query.push('=');
        self.query.push_str(&percent_encode(&value.to_string()));
        self
    }

    /// Appends `name=value` when there is a value.
    pub fn optional_query(self, name: &str, value: Option<impl Display>) -> UrlBuilder {
        match value {
            Some(value) => self.query(name, value),
            None => self,
        }
    }

    /// The URL, or [`PrepareError::InvalidArguments`] naming a segment that was empty,
    /// `.` or `..`.
    pub fn build(self) -> Result<String, PrepareError> {
        match self.bad_segment {
            Some(segment) => Err(PrepareError::invalid(format!(
                "{segment:?} cannot be used as a URL path segment"
            ))),
            None => Ok(self.path + &self.query),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unreserved_characters_survive_encoding() {
        assert_eq!(percent_encode("aZ0-._~"), "aZ0-._~");
        assert_eq!(
            percent_encode("a b/c?d#e&f=g+h%"),
            "a%20b%2Fc%3Fd%23e%26f%3Dg%2Bh%25"
        );
        assert_eq!(percent_encode("é"), "%C3%A9");
        assert_eq!(percent_encode(""), "");
    }

    #[test]
    fn segments_are_encoded_and_fixed_paths_are_not() {
        let url = UrlBuilder::new("http://127.0.0.1:8080/")
            .path("/repos/")
            .segment("own er")
            .segment("../etc")
            .path("issues")
            .segment(42)
            .build();
        assert_eq!(
            url,
            Ok("http://127.0.0.1:8080/repos/own%20er/..%2Fetc/issues/42".to_owned())
        );
    }

    #[test]
    fn dot_and_empty_segments_are_refused() {
        for bad in ["", ".", ".."] {
            let built = UrlBuilder::new("http://h/base")
                .segment(bad)
                .segment("x")
                .build();
            assert!(
                matches!(&built, Err(PrepareError::InvalidArguments(m)) if m.contains("path segment")),
                "{bad:?}: {built:?}"
            );
        }
        assert!(UrlBuilder::new("http://h").segment("...").build().is_ok());
    }

    #[test]
    fn query_comes_last_whatever_the_order() {
        let url = UrlBuilder::new("https://api.example.com/base")
            .query("limit", 10)
            .path("v1/charges")
            .optional_query("customer", Some("cus_1&x=2"))
            .optional_query("missing", None::<&str>);
        assert_eq!(
            url.build().unwrap(),
            "https://api.example.com/base/v1/charges?limit=10&customer=cus_1%26x%3D2"
        );
    }

    #[test]
    fn empty_fixed_path_adds_nothing() {
        assert_eq!(
            UrlBuilder::new("http://h")
                .path("")
                .path("/")
                .build()
                .unwrap(),
            "http://h"
        );
    }
}
