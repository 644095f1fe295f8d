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
    // Rust's `{:e}` gives the shortest round-trip digits; re-lay them out as ECMAScript does.
    let formatted = format!("{:e}", f.abs());
    let (mantissa, exponent) = formatted.split_once('e').expect("`{:e}` has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    let k = digits.len() as i32;
    let n = exponent + 1;
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
            (0.000001, "0.000001"),
            (123.456, "123.456"),
            (5e-324, "5e-324"),
        ] {
            assert_eq!(ecmascript_number(input), expected, "{input}");
        }
    }

    #[test]
    fn rfc_8785_example_ordering_and_escaping() {
        let value: Value = serde_json::from_str(
            r#"{"\u20ac":"Euro","\r":"cr","1":"one","\ud83d\ude00":"emoji","\u0080":"ctl","\u00f6":"o"}"#,
        )
        .unwrap();
        assert_eq!(
            canonical_json(&value),
            "{\"\\r\":\"cr\",\"1\":\"one\",\"\u{80}\":\"ctl\",\"ö\":\"o\",\"€\":\"Euro\",\"😀\":\"emoji\"}"
        );
    }
}
