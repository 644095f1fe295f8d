//! Arguments may only hold numbers an IEEE 754 double carries exactly (I-JSON, RFC 7493 §2.2).
//!
//! RFC 8785 hashes a number as the ECMAScript shortest form of a double, so two literals that
//! round to one double (`9007199254740992` and `9007199254740993`, or `1` and
//! `1.00000000000000000001`) would hash alike: a different call could replay another's result,
//! or spend an approval on arguments its owner never saw. Such numbers are refused instead.
//!
//! **Exact** means: the literal's decimal value equals the decimal value of the shortest
//! round-trip form of the double nearest to it, the form RFC 8785 hashes (of two equally short
//! forms, ECMAScript's: the nearer, then the even). So `0.1`, `4.50`, `1e2`, `1E+2`, `-0`,
//! `5e-324` and every integer of magnitude up to 2^53 are exact; `9007199254740993`,
//! `1.00000000000000000001`, `1e400` (no finite double) and `1e-400` (rounds to zero) are not.
//! Nor is `9223372036854775808`, although 2^63 is itself a double: its shortest form is
//! `9223372036854776000`, a different decimal value, and accepting both spellings would let
//! one of them be hashed by a text that does not denote what the client wrote. With this rule
//! the canonical text of every accepted number denotes exactly the value the client wrote, so
//! two accepted calls hash alike only if their numbers are equal as decimals.
//!
//! The check reads the request **text**, not a `serde_json::Value`: by the time a `Value`
//! exists, a fraction such as `1.00000000000000000001` has already been rounded to a double and
//! cannot be told from `1`. serde_json's `arbitrary_precision` feature would keep the digits,
//! but it is unified across the whole build: it turns every `Number` into a string wrapper that
//! serde's buffered (`untagged`, `flatten`) deserialisation sees as a map, which changes how
//! cedar-policy's untagged JSON values, rmcp's models and `cel::to_value` read numbers.
//! The workspace enables serde_json's `float_roundtrip` instead, so the `Value` the gateway
//! hashes holds the same nearest double this check computes (without it serde_json's fast
//! path is often one ulp off, and two different accepted literals could parse to one double).

use std::borrow::Cow;
use std::fmt;

/// A number in the arguments that no IEEE 754 double represents exactly.
///
/// Its message names the JSON pointer (RFC 6901) of the number, never its digits: argument
/// values can be secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InexactNumber {
    pointer: String,
}

impl fmt::Display for InexactNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the number at {} cannot be represented exactly as an IEEE 754 double \
             (I-JSON, RFC 7493)",
            Location(&self.pointer)
        )
    }
}

impl std::error::Error for InexactNumber {}

impl InexactNumber {
    /// The JSON pointer of the number, relative to the checked document or scope (`""` for the
    /// root).
    pub fn pointer(&self) -> &str {
        &self.pointer
    }
}

/// Renders a pointer for a message: `the top level` for the root, control characters escaped.
struct Location<'a>(&'a str);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("the top level");
        }
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_unicode())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

/// Checks every number in the JSON text `json` (the arguments as the client sent them) and
/// returns the first that is not exact (see the module documentation).
///
/// `json` must be text serde_json accepted. On other text this never panics, but its verdict
/// is unspecified.
pub fn exact_numbers(json: impl AsRef<[u8]>) -> Result<(), InexactNumber> {
    exact_numbers_at(json, &[])
}

/// As [`exact_numbers`], but only for the numbers at or under `scope`, a path of member names
/// and array indices (`&["params", "arguments"]` checks a `tools/call` body's arguments), and
/// with pointers relative to it.
///
/// If a member name repeats, serde_json keeps the last value, but every one in the text is
/// checked: that can only refuse more.
pub fn exact_numbers_at(json: impl AsRef<[u8]>, scope: &[&str]) -> Result<(), InexactNumber> {
    let text = json.as_ref();
    let mut path: Vec<Step<'_>> = Vec::new();
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            b'{' => {
                path.push(Step::Member {
                    name: None,
                    expecting_name: true,
                });
                i += 1;
            }
            b'[' => {
                path.push(Step::Element(0));
                i += 1;
            }
            b'}' | b']' => {
                path.pop();
                i += 1;
            }
            b',' => {
                match path.last_mut() {
                    Some(Step::Member { expecting_name, .. }) => *expecting_name = true,
                    Some(Step::Element(index)) => *index += 1,
                    None => {}
                }
                i += 1;
            }
            b'"' => {
                let end = string_end(text, i);
                if let Some(Step::Member {
                    name,
                    expecting_name,
                }) = path.last_mut()
                    && *expecting_name
                {
                    *name = Some(member_name(&text[i + 1..end.saturating_sub(1).max(i + 1)]));
                    *expecting_name = false;
                }
                i = end;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < text.len()
                    && matches!(text[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
                {
                    i += 1;
                }
                let literal = std::str::from_utf8(&text[start..i]).unwrap_or("");
                if !is_exact(literal)
                    && let Some(pointer) = pointer_within(&path, scope)
                {
                    return Err(InexactNumber { pointer });
                }
            }
            // Whitespace, `:`, and the letters of `true`, `false` and `null`.
            _ => i += 1,
        }
    }
    Ok(())
}

/// Where the scanner is: in an object (the member being read) or an array (the element).
enum Step<'t> {
    Member {
        name: Option<Cow<'t, str>>,
        expecting_name: bool,
    },
    Element(usize),
}

/// The index just past the string that opens at `start`.
fn string_end(text: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < text.len() {
        match text[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    text.len()
}

/// A member's name: borrowed from the text unless it has escapes to decode (names are read
/// for every member, and only an inexact number's pointer needs them as strings).
fn member_name(body: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(body) {
        Ok(name) if !body.contains(&b'\\') => Cow::Borrowed(name),
        _ => Cow::Owned(unescape(body)),
    }
}

/// Decodes the body of a JSON string (between its quotes).
fn unescape(body: &[u8]) -> String {
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'\\' {
            out.push(body[i]);
            i += 1;
            continue;
        }
        let escape = body.get(i + 1).copied().unwrap_or(b'\\');
        i += 2;
        let c = match escape {
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let high = hex4(body, i);
                i += 4;
                match high {
                    Some(high @ 0xD800..=0xDBFF)
                        if body.get(i) == Some(&b'\\') && body.get(i + 1) == Some(&b'u') =>
                    {
                        match hex4(body, i + 2) {
                            Some(low @ 0xDC00..=0xDFFF) => {
                                i += 6;
                                char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
                                    .unwrap_or(char::REPLACEMENT_CHARACTER)
                            }
                            _ => char::REPLACEMENT_CHARACTER,
                        }
                    }
                    Some(unit) => char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER),
                    None => char::REPLACEMENT_CHARACTER,
                }
            }
            other => char::from(other),
        };
        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex4(text: &[u8], at: usize) -> Option<u32> {
    let digits = std::str::from_utf8(text.get(at..at + 4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

/// The RFC 6901 pointer of the current value relative to `scope`, or `None` outside it.
fn pointer_within(path: &[Step<'_>], scope: &[&str]) -> Option<String> {
    let mut segments = path.iter().map(|step| match step {
        Step::Member { name, .. } => name.as_deref().unwrap_or_default().to_owned(),
        Step::Element(index) => index.to_string(),
    });
    for expected in scope {
        if segments.next()? != *expected {
            return None;
        }
    }
    Some(segments.fold(String::new(), |mut pointer, segment| {
        pointer.push('/');
        pointer.push_str(&segment.replace('~', "~0").replace('/', "~1"));
        pointer
    }))
}

/// Whether the JSON number `literal` is exact (see the module documentation).
pub(super) fn is_exact(literal: &str) -> bool {
    is_short_integer(literal) || is_exact_by_decimals(literal)
}

/// An integer of at most 15 digits: below 2^53 in magnitude, so a double holds it and its
/// shortest form is itself. Most arguments' numbers (and JSON-RPC ids) are such, and skip the
/// decimal comparison (4.7 k instructions a call for a JSON-RPC id and one small argument).
fn is_short_integer(literal: &str) -> bool {
    let digits = literal.strip_prefix('-').unwrap_or(literal);
    (1..=15).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit())
}

/// [`is_exact`] by comparing the literal's decimal value with its nearest double's shortest
/// form.
fn is_exact_by_decimals(literal: &str) -> bool {
    // Rust's float parsing rounds correctly to nearest, ties to even.
    let Ok(nearest) = literal.parse::<f64>() else {
        return false;
    };
    if !nearest.is_finite() {
        return false;
    }
    // Signs need no comparison: a literal and its nearest double share one unless the double
    // is zero, and zero compares by digits alone.
    Decimal::of_literal(literal).is_some_and(|written| written == Decimal::of_double(nearest))
}

/// A non-negative decimal `0.digits × 10^exponent`, with no leading or trailing zero digit
/// (zero has no digits and exponent 0): two are equal exactly when their values are.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Decimal {
    digits: Vec<u8>,
    exponent: i64,
}

impl Decimal {
    /// The value of a JSON number literal, without its sign.
    pub(super) fn of_literal(literal: &str) -> Option<Decimal> {
        let unsigned = literal.strip_prefix('-').unwrap_or(literal);
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], Some(&unsigned[at + 1..])),
            None => (unsigned, None),
        };
        let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let exponent = match exponent {
            None => 0,
            Some(text) => {
                let (negative, digits) = match text.as_bytes().first() {
                    Some(b'-') => (true, &text[1..]),
                    Some(b'+') => (false, &text[1..]),
                    _ => (false, text),
                };
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                // Saturating: an exponent this large leaves no finite, non-zero double, and
                // the comparison with the double's exponent then fails as it should.
                let magnitude = digits.bytes().fold(0i64, |e, b| {
                    e.saturating_mul(10).saturating_add(i64::from(b - b'0'))
                });
                if negative { -magnitude } else { magnitude }
            }
        };
        if integer.is_empty()
            || !(integer.bytes().chain(fraction.bytes())).all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let point = i64::try_from(integer.len()).ok()?;
        Some(Decimal::normalized(
            integer.bytes().chain(fraction.bytes()).collect(),
            point.saturating_add(exponent),
        ))
    }

    /// The value of the shortest round-trip form of `f` that RFC 8785 prints, without its sign.
    pub(super) fn of_double(f: f64) -> Decimal {
        if f == 0.0 {
            return Decimal::normalized(Vec::new(), 0);
        }
        let (digits, n) = super::canonical::shortest_digits(f);
        Decimal::normalized(digits.into_bytes(), i64::from(n))
    }

    /// `0.digits × 10^point`, with its zero digits stripped.
    fn normalized(mut digits: Vec<u8>, mut point: i64) -> Decimal {
        let leading = digits.iter().take_while(|d| **d == b'0').count();
        if leading == digits.len() {
            return Decimal {
                digits: Vec::new(),
                exponent: 0,
            };
        }
        digits.drain(..leading);
        point = point.saturating_sub(i64::try_from(leading).unwrap_or(i64::MAX));
        let trailing = digits.iter().rev().take_while(|d| **d == b'0').count();
        digits.truncate(digits.len() - trailing);
        Decimal {
            digits,
            exponent: point,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_literals_are_accepted() {
        for literal in [
            "0",
            "-0",
            "0.0",
            "-0.0e-5",
            "0e999999999999999999999",
            "1",
            "-1",
            "0.1",
            "0.2",
            "0.3",
            "4.50",
            "2e-3",
            "1e2",
            "1E+2",
            "1E2",
            "10e1",
            "100.000",
            "1E30",
            "1e-27",
            "0.000000000000000000000000001",
            "5e-324",
            "-5e-324",
            "1.7976931348623157e308",
            "1.7976931348623157E+308",
            "-1.7976931348623157e+308",
            "9007199254740992",
            "-9007199254740992",
            "9007199254740991",
            "9007199254740994",
            "9007199254740992.0",
            "1e21",
            "1e23",
            "123.456",
            "333333333.3333333",
            "295147905179352830000",
            "9223372036854776000",
            "0.10000000000000002",
            "1.0000000000000002",
            // RFC 8785 Appendix B, note 4: halfway between .2 and .3, printed as the even one.
            "1424953923781206.2",
        ] {
            assert!(is_exact(literal), "{literal} is exact");
        }
    }

    #[test]
    fn inexact_literals_are_refused() {
        for literal in [
            // 2^53 + 1 rounds to 2^53 (ties to even); 2^53 + 3 to 2^53 + 4.
            "9007199254740993",
            "-9007199254740993",
            "9007199254740995",
            "9007199254740993.0",
            "9007199254740992.5",
            "1.00000000000000000001",
            "0.1000000000000000000001",
            "0.10000000000000001",
            // The double is 1424953923781206.25 exactly; RFC 8785 prints it 1424953923781206.2.
            "1424953923781206.3",
            "1424953923781206.25",
            // The RFC 8785 §3.2.2.3 sample number: its double prints as 333333333.3333333.
            "333333333.33333329",
            // u64::MAX, 2^63 and 2^64 + 1: serde_json keeps the first two as integers.
            "18446744073709551615",
            "9223372036854775808",
            "18446744073709551617",
            "-9223372036854775809",
            "295147905179352825856",
            // No finite double, or a non-zero value that rounds to zero.
            "1e400",
            "-1e400",
            "1e309",
            "1e99999999999999999999999",
            "2e-324",
            "1e-400",
            "1e-99999999999999999999999",
            "4.9406564584124654e-324",
        ] {
            assert!(!is_exact(literal), "{literal} is inexact");
        }
    }

    #[test]
    fn every_integer_up_to_two_to_the_53_is_exact() {
        let limit: i64 = 1 << 53;
        for n in (0..2_000)
            .chain(limit - 2_000..=limit)
            .chain((0..64).map(|shift| (1i64 << (shift % 53)) + 1))
        {
            assert!(is_exact(&n.to_string()), "{n}");
            assert!(is_exact(&(-n).to_string()), "-{n}");
        }
        assert!(!is_exact(&(limit + 1).to_string()));
    }

    /// The shortcut for short integers agrees with the decimal comparison wherever it
    /// answers, and leaves 16 digits (where 2^53 + 1 lives) to the comparison.
    #[test]
    fn short_integers_are_exact_by_their_decimals_too() {
        let mut state: u64 = 0x2545_F491_4F6C_DD1D;
        let mut literals = vec!["0".to_owned(), "-0".to_owned(), "9".repeat(15)];
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let digits = 1 + (state % 15) as usize;
            let n = (state >> 8) % 10u64.pow(digits as u32);
            let sign = if state & 1 == 1 { "-" } else { "" };
            literals.push(format!("{sign}{n}"));
        }
        for literal in &literals {
            assert!(is_short_integer(literal), "{literal}");
            assert!(is_exact_by_decimals(literal), "{literal}");
        }
        for longer in ["9007199254740993", "-9007199254740993", "1000000000000000"] {
            assert!(!is_short_integer(longer), "{longer}");
        }
        assert!(!is_exact("9007199254740993"));
        for not_integers in ["1.5", "1e2", "-", "", "1-2"] {
            assert!(!is_short_integer(not_integers), "{not_integers}");
        }
    }

    #[test]
    fn every_double_printed_as_rfc_8785_does_is_exact_and_a_digit_more_is_not() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let f = f64::from_bits(state);
            if !f.is_finite() || f == 0.0 {
                continue;
            }
            let canonical = super::super::canonical_json(&serde_json::Value::from(f));
            assert!(is_exact(&canonical), "{canonical}");
            let (digits, n) = super::super::canonical::shortest_digits(f);
            let sign = if f < 0.0 { "-" } else { "" };
            let scientific = format!("{sign}0.{digits}e{n}");
            assert!(is_exact(&scientific), "{scientific}");
            // Rust's own shortest form differs only in a tie, and is then the odd neighbour.
            let rust = format!("{f:e}");
            let rust_digits = rust.split('e').next().unwrap().replace(['-', '.'], "");
            assert_eq!(is_exact(&rust), rust_digits == digits, "{rust}");
            // A 1 far past the last significant digit: a new value the double cannot tell.
            let longer = format!("{sign}0.{digits}0000000000000000000001e{n}");
            assert!(!is_exact(&longer), "{longer}");
        }
    }

    #[test]
    fn decimals_compare_by_value() {
        let d = |s| Decimal::of_literal(s).unwrap();
        assert_eq!(d("4.50"), d("45e-1"));
        assert_eq!(d("0.002"), d("2e-3"));
        assert_eq!(d("100"), d("1E+2"));
        assert_eq!(d("-0"), d("0.000"));
        assert_ne!(d("0.1"), d("0.01"));
        assert_eq!(d("0.1"), Decimal::of_double(0.1));
        assert_eq!(d("5e-324"), Decimal::of_double(f64::from_bits(1)));
        assert_eq!(d("0"), Decimal::of_double(-0.0));
        for malformed in ["", "-", "1e", "1e+", ".5", "1.2.3", "0x10", "1e5e5"] {
            assert_eq!(Decimal::of_literal(malformed), None, "{malformed}");
            assert!(!is_exact(malformed), "{malformed}");
        }
    }

    #[test]
    fn the_first_inexact_number_is_named_by_its_pointer() {
        let text = r#"{"amount": 9007199254740993, "note": "9007199254740993"}"#;
        let error = exact_numbers(text).unwrap_err();
        assert_eq!(error.pointer(), "/amount");
        assert_eq!(
            error.to_string(),
            "the number at /amount cannot be represented exactly as an IEEE 754 double \
             (I-JSON, RFC 7493)"
        );

        let text = r#"{
            "ok": [1, 0.5, -0, 1e2, {"deep": 5e-324}],
            "a/b~c": {"list": [true, null, "x\"1e400", [0.1, 1.00000000000000000001]]}
        }"#;
        assert_eq!(
            exact_numbers(text).unwrap_err().pointer(),
            "/a~1b~0c/list/3/1"
        );

        let text = r#"{"\u00e9\"\ud83d\ude00\n": [0, 1e400]}"#;
        let error = exact_numbers(text).unwrap_err();
        assert_eq!(error.pointer(), "/é\"😀\n/1");
        assert_eq!(
            error.to_string(),
            "the number at /é\"😀\\u{a}/1 cannot be represented exactly as an IEEE 754 double \
             (I-JSON, RFC 7493)"
        );

        let error = exact_numbers("18446744073709551617").unwrap_err();
        assert_eq!(error.pointer(), "");
        assert!(
            error
                .to_string()
                .starts_with("the number at the top level cannot")
        );
    }

    #[test]
    fn the_message_never_carries_the_value() {
        let error = exact_numbers(r#"{"pin": 12345678901234567890123}"#).unwrap_err();
        assert!(!error.to_string().contains("1234"));
        assert!(!format!("{error:?}").contains("1234"));
    }

    #[test]
    fn exact_documents_pass() {
        for text in [
            "{}",
            "[]",
            "0",
            r#"{"a": [], "b": {}, "c": [[[]]], "d": "1e400", "e": "\\", "f": -0.0}"#,
            r#"{"amount": 9007199254740992, "rate": 0.1, "big": 1e308, "tiny": 5e-324}"#,
            r#"{"numbers": [333333333.3333333, 1E30, 4.50, 2e-3, 0.000000000000000000000000001]}"#,
        ] {
            assert_eq!(exact_numbers(text), Ok(()), "{text}");
        }
    }

    #[test]
    fn a_scope_checks_only_what_is_under_it() {
        let body = br#"{"jsonrpc": "2.0", "id": 9007199254740993, "method": "tools/call",
            "params": {"name": "payments.refund", "_meta": {"progressToken": 1e400},
                       "arguments": {"amount": 10, "ids": [1, 9007199254740993]}}}"#;
        let error = exact_numbers_at(body, &["params", "arguments"]).unwrap_err();
        assert_eq!(error.pointer(), "/ids/1");
        assert_eq!(exact_numbers(body).unwrap_err().pointer(), "/id");

        let exact = br#"{"id": 1e400, "params": {"arguments": {"amount": 10}}}"#;
        assert_eq!(exact_numbers_at(exact, &["params", "arguments"]), Ok(()));
        // A repeated name: serde_json keeps the last value, the check covers both.
        let repeated = br#"{"params": {"arguments": {"a": 1e400}, "arguments": {"a": 1}}}"#;
        assert_eq!(
            exact_numbers_at(repeated, &["params", "arguments"])
                .unwrap_err()
                .pointer(),
            "/a"
        );
        assert_eq!(
            exact_numbers_at(r#"[0, [1, 1e400]]"#, &["1"])
                .unwrap_err()
                .pointer(),
            "/1"
        );
    }

    #[test]
    fn malformed_text_never_panics() {
        for text in [
            "",
            "{",
            "}",
            "]",
            "\"",
            "\"\\",
            "\"\\u12",
            "{\"a",
            "{\"a\":",
            "-",
            "1e",
            "[1,",
            "{\"\\ud800\":1e400}",
            ",,,",
            "{,}",
        ] {
            let _ = exact_numbers(text);
            let _ = exact_numbers_at(text, &["a"]);
        }
    }
}
