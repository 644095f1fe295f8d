//! RFC 8785 (JSON Canonicalization Scheme) for `serde_json::Value`.

use serde_json::Value;

/// Renders `value` canonically: object members sorted by the UTF-16 code units of their names,
/// no insignificant whitespace, strings with the minimal JSON escaping, numbers in the
/// ECMAScript shortest round-trip form.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write(value, &mut out);
    out
}

fn write(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write(item, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<(&String, &Value)> = members.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (name, item)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(name, out);
                out.push(':');
                write(item, out);
            }
            out.push('}');
        }
    }
}

/// Integers serde_json holds exactly are printed exactly. For every number the gateway accepts
/// (see `numbers.rs`) that is the text RFC 8785 prints for its double; an integer no double
/// carries is refused before hashing, and even so it never hashes like its rounded neighbour.
fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else {
        let f = n.as_f64().unwrap_or(0.0);
        out.push_str(&ecmascript_number(f));
    }
}

/// ECMAScript's Number::toString for finite doubles (JSON has no others).
fn ecmascript_number(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    let (digits, n) = shortest_digits(f);
    let k = digits.len() as i32;
    let mut s = String::new();
    if f < 0.0 {
        s.push('-');
    }
    if k <= n && n <= 21 {
        s.push_str(&digits);
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        s.push_str(&digits[..n as usize]);
        s.push('.');
        s.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        s.push_str("0.");
        s.extend(std::iter::repeat_n('0', (-n) as usize));
        s.push_str(&digits);
    } else {
        s.push_str(&digits[..1]);
        if k > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        s.push('e');
        s.push(if n > 0 { '+' } else { '-' });
        s.push_str(&(n - 1).abs().to_string());
    }
    s
}

/// The digits `d1…dk` and the exponent `n` of ECMAScript's Number::toString for a finite,
/// non-zero `f` (its magnitude is `0.d1…dk × 10^n`): the fewest digits that read back as `f`;
/// of those, the nearest to `f`; of two equally near, the even one (RFC 8785 Appendix B,
/// `1424953923781206.2`).
pub(super) fn shortest_digits(f: f64) -> (String, i32) {
    // Rust's `{:e}` prints the fewest digits, the nearest of them to `f`, but can settle an
    // exact tie on the odd one (it printed 1424953923781206.3).
    let formatted = format!("{:e}", f.abs());
    let (mantissa, exponent) = formatted.split_once('e').expect("`{:e}` has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = exponent.parse::<i32>().expect("an integer exponent") + 1;
    // A tie: `f` is exactly halfway between two k-digit candidates, its exact decimal having
    // k + 1 digits, the last a 5.
    let k = digits.len();
    if let Some((exact, exact_n)) = exact_decimal(f.abs())
        && exact.len() == k + 1
        && exact.ends_with('5')
        && exact_n == n
        && let (Ok(low), Ok(printed)) = (exact[..k].parse::<u64>(), digits.parse::<u64>())
        && (printed == low || printed == low + 1)
        && (low + 1).to_string().len() == k
    {
        let even = if low % 2 == 0 { low } else { low + 1 };
        let even = even.to_string();
        return (even.trim_end_matches('0').to_owned(), n);
    }
    (digits, n)
}

/// The exact decimal value of a positive double as its significant digits and exponent `n`
/// (`0.digits × 10^n`), when those are at most 38 digits; `None` otherwise or for an integer
/// (neither can be a tie between two shortest candidates).
fn exact_decimal(f: f64) -> Option<(String, i32)> {
    let bits = f.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let fraction = bits & ((1 << 52) - 1);
    let (mut mantissa, mut exponent) = if biased == 0 {
        (fraction, -1074)
    } else {
        (fraction | (1 << 52), biased - 1075)
    };
    if mantissa == 0 {
        return None;
    }
    let zeros = mantissa.trailing_zeros();
    mantissa >>= zeros;
    exponent += zeros as i32;
    if exponent >= 0 {
        return None;
    }
    // f = mantissa × 2^exponent = mantissa × 5^-exponent × 10^exponent.
    let mut scaled = u128::from(mantissa);
    for _ in 0..-exponent {
        scaled = scaled.checked_mul(5)?;
    }
    let digits = scaled.to_string();
    let n = digits.len() as i32 + exponent;
    Some((digits, n))
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_follow_ecmascript() {
        for (input, expected) in [
            (1.0, "1"),
            (-0.5, "-0.5"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1.5e-7, "1.5e-7"),
            (1e-7, "1e-7"),
            (0.000001, "0.000001"),
            (123.456, "123.456"),
            (4.50, "4.5"),
            (2e-3, "0.002"),
            (1e30, "1e+30"),
            (1e-27, "1e-27"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(ecmascript_number(input), expected, "{input}");
        }
    }

    #[test]
    fn ties_between_two_shortest_forms_go_to_the_even_one() {
        // 1424953923781206.25 (Appendix B's note 4) and other doubles with a quarter or an
        // eighth: where two forms are equally short and near, the even one; always one that
        // reads back as the double and no longer than Rust's.
        let mut ties = 0;
        for i in 0..20_000u64 {
            for scale in [4.0, 8.0, 2.0, 1024.0] {
                let f = ((1u64 << 53) + i * 7919) as f64 / scale;
                let (digits, n) = shortest_digits(f);
                let rust = format!("{f:e}");
                let rust_digits = rust.split('e').next().unwrap().replace('.', "");
                assert!(digits.len() <= rust_digits.len(), "{f}");
                let text = format!("0.{digits}e{n}");
                assert_eq!(text.parse::<f64>().unwrap(), f, "{text}");
                if digits != rust_digits {
                    ties += 1;
                    assert_eq!(digits.len(), rust_digits.len(), "{f}");
                    assert!(
                        digits.as_bytes()[digits.len() - 1] % 2 == 0,
                        "{f}: {digits}"
                    );
                }
            }
        }
        assert!(ties > 0);
        // 1424953923781206.25 exactly.
        let quarter = f64::from_bits(0x43143ff3c1cb0959);
        assert_eq!(quarter.fract(), 0.25);
        assert_eq!(ecmascript_number(quarter), "1424953923781206.2");
        assert_eq!(ecmascript_number(-quarter), "-1424953923781206.2");
    }

    /// RFC 8785 Appendix B: IEEE 754 bit patterns and their canonical text.
    const APPENDIX_B: [(u64, &str); 24] = [
        (0x0000000000000000, "0"),
        (0x8000000000000000, "0"),
        (0x0000000000000001, "5e-324"),
        (0x8000000000000001, "-5e-324"),
        (0x7fefffffffffffff, "1.7976931348623157e+308"),
        (0xffefffffffffffff, "-1.7976931348623157e+308"),
        (0x4340000000000000, "9007199254740992"),
        (0xc340000000000000, "-9007199254740992"),
        (0x4430000000000000, "295147905179352830000"),
        (0x44b52d02c7e14af5, "9.999999999999997e+22"),
        (0x44b52d02c7e14af6, "1e+23"),
        (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
        (0x444b1ae4d6e2ef4e, "999999999999999700000"),
        (0x444b1ae4d6e2ef4f, "999999999999999900000"),
        (0x444b1ae4d6e2ef50, "1e+21"),
        (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
        (0x3eb0c6f7a0b5ed8d, "0.000001"),
        (0x41b3de4355555553, "333333333.3333332"),
        (0x41b3de4355555554, "333333333.33333325"),
        (0x41b3de4355555555, "333333333.3333333"),
        (0x41b3de4355555556, "333333333.3333334"),
        (0x41b3de4355555557, "333333333.33333343"),
        (0xbecbf647612f3696, "-0.0000033333333333333333"),
        (0x43143ff3c1cb0959, "1424953923781206.2"),
    ];

    #[test]
    fn rfc_8785_appendix_b_numbers() {
        for (bits, expected) in APPENDIX_B {
            let f = f64::from_bits(bits);
            assert_eq!(canonical_json(&Value::from(f)), expected, "{bits:016x}");
            // The canonical text is itself accepted, parses back to the same double and
            // canonicalises to itself.
            assert!(super::super::numbers::is_exact(expected), "{expected}");
            let parsed: Value = serde_json::from_str(expected).unwrap();
            assert_eq!(parsed.as_f64().unwrap().to_bits(), (f + 0.0).to_bits());
            assert_eq!(canonical_json(&parsed), expected);
        }
        // NaN (0x7fffffffffffffff) and Infinity (0x7ff0000000000000) are no JSON numbers.
        for bits in [0x7fffffffffffffff_u64, 0x7ff0000000000000] {
            assert!(serde_json::Number::from_f64(f64::from_bits(bits)).is_none());
        }
    }

    #[test]
    fn negative_zero_and_exponents() {
        for (text, expected) in [
            ("-0", "0"),
            ("-0.0", "0"),
            ("0e10", "0"),
            ("-0E-10", "0"),
            ("[-0, 0, 0.0]", "[0,0,0]"),
            ("1e2", "100"),
            ("1E+2", "100"),
            ("100.0", "100"),
            ("1e20", "100000000000000000000"),
            ("1e21", "1e+21"),
            ("1E21", "1e+21"),
            ("12e20", "1.2e+21"),
            ("-1e-7", "-1e-7"),
            ("0.0000001", "1e-7"),
            ("1e-6", "0.000001"),
            ("0.0000012", "0.0000012"),
            ("1E30", "1e+30"),
            ("2e-3", "0.002"),
            ("4.50", "4.5"),
            ("1.7976931348623157E308", "1.7976931348623157e+308"),
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            assert_eq!(canonical_json(&value), expected, "{text}");
        }
    }

    /// RFC 8785 §3.2.2: the sample of numbers, string escapes and literals.
    #[test]
    fn rfc_8785_sample_escaping() {
        let input = r#"{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}"#;
        let value: Value = serde_json::from_str(input).unwrap();
        assert_eq!(
            canonical_json(&value),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
        // Its first number is one the gateway refuses: it is not the value its double prints as.
        assert_eq!(
            super::super::exact_numbers(input).unwrap_err().pointer(),
            "/numbers/0"
        );
    }

    #[test]
    fn control_characters_are_escaped_minimally() {
        let value = Value::String("\u{0}\u{8}\t\n\u{b}\u{c}\r\u{1f} \u{7f}/\"\\é".into());
        assert_eq!(
            canonical_json(&value),
            "\"\\u0000\\b\\t\\n\\u000b\\f\\r\\u001f \u{7f}/\\\"\\\\é\""
        );
    }

    /// RFC 8785 §3.2.3: members sort by UTF-16 code units, so U+1F600 (a surrogate pair)
    /// sorts before U+FB33 although its code point is larger.
    #[test]
    fn rfc_8785_sample_ordering() {
        let value: Value = serde_json::from_str(
            r#"{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}"#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&value),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\
             \"\u{f6}\":\"Latin Small Letter O With Diaeresis\",\"\u{20ac}\":\"Euro Sign\",\
             \"\u{1f600}\":\"Emoji: Grinning Face\",\
             \"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }
}
