//! The text form key hashes and request hashes are written in: `sha256:` and the digest's 64
//! lower-case hex digits.

use std::fmt;

/// Writes `digest` as `sha256:<hex>` in one piece: a call writes a few of these, and through
/// `hex::encode` and `write!` each was an allocation, a character at a time, and `fmt`'s
/// machinery.
pub(crate) fn write_sha256(digest: &[u8; 32], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let mut text = [0u8; PREFIX.len() + 64];
    text[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
    hex::encode_to_slice(digest, &mut text[PREFIX.len()..]).expect("64 digits fit");
    f.write_str(std::str::from_utf8(&text).expect("ASCII"))
}

const PREFIX: &str = "sha256:";

#[cfg(test)]
mod tests {
    use super::*;

    struct Text([u8; 32]);

    impl fmt::Display for Text {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write_sha256(&self.0, f)
        }
    }

    proptest::proptest! {
        #![proptest_config(crate::properties::config())]

        /// Key hashes are compared as text with the config's, and request hashes with those
        /// stored in claims: the form must be the one `hex` wrote before.
        #[test]
        fn a_digest_is_written_as_hex_writes_it(digest in proptest::prelude::any::<[u8; 32]>()) {
            proptest::prop_assert_eq!(
                Text(digest).to_string(),
                format!("sha256:{}", hex::encode(digest))
            );
        }
    }
}
