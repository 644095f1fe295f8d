//! `allowed_tools` globs over namespaced tool names.

use std::fmt;

/// A glob over `connector.tool` names: `*` matches any run of characters (dots included),
/// `?` exactly one; everything else is literal. `stripe.*` therefore allows `stripe.charges.list`.
#[derive(Clone, PartialEq, Eq)]
pub struct ToolGlob {
    pattern: Box<str>,
}

impl ToolGlob {
    pub fn parse(pattern: &str) -> Result<ToolGlob, String> {
        if pattern.is_empty() {
            return Err("an allowed_tools entry must not be empty".into());
        }
        if let Some(bad) = pattern
            .chars()
            .find(|c| c.is_whitespace() || c.is_control())
        {
            return Err(format!("allowed_tools entry {pattern:?} contains {bad:?}"));
        }
        Ok(ToolGlob {
            pattern: pattern.into(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Whether the pattern names one tool exactly, without wildcards.
    pub fn is_verbatim(&self) -> bool {
        !self.pattern.contains(['*', '?'])
    }

    pub fn matches(&self, name: &str) -> bool {
        matches(self.pattern.as_bytes(), name.as_bytes())
    }
}

impl fmt::Debug for ToolGlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.pattern)
    }
}

/// Iterative wildcard matching with single-star backtracking: linear in practice and
/// never exponential, whatever the operator writes.
fn matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == b'?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_like_an_operator_expects() {
        let cases = [
            ("stripe.*", "stripe.create_refund", true),
            ("stripe.*", "stripe.charges.list", true),
            ("stripe.*", "stripes.create_refund", false),
            ("*.list", "stripe.charges.list", true),
            ("stripe.charges.*", "stripe.create_refund", false),
            ("stripe.create_refund", "stripe.create_refund", true),
            ("stripe.create_refund", "stripe.create_refunds", false),
            ("*", "anything.at.all", true),
            ("tracker.issues.?et", "tracker.issues.get", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXbY", false),
        ];
        for (pattern, name, expected) in cases {
            let glob = ToolGlob::parse(pattern).unwrap();
            assert_eq!(glob.matches(name), expected, "{pattern} vs {name}");
        }
    }

    #[test]
    fn verbatim_means_no_wildcard() {
        assert!(
            ToolGlob::parse("stripe.create_refund")
                .unwrap()
                .is_verbatim()
        );
        assert!(!ToolGlob::parse("stripe.*").unwrap().is_verbatim());
        assert!(ToolGlob::parse("").is_err());
        assert!(ToolGlob::parse("a b").is_err());
    }
}
