//! Who may see and call what: virtual keys and the tool prefilter.
//!
//! A key is presented as a bearer token and stored only as its sha256. What a key may list
//! and call is decided here and nowhere else, so that listing and calling cannot disagree.

mod glob;
mod keys;

pub use glob::ToolGlob;
pub use keys::{KeyHash, KeyTable, VirtualKey};
