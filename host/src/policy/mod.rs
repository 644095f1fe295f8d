//! Who may see and call what: virtual keys and the tool prefilter.
//!
//! A key is presented as a bearer token and stored only as its sha256. What a key may list
//! and call is decided here and nowhere else ([`decide`]: the prefilter, then Cedar), so
//! that listing and calling cannot disagree.

#[cfg(any(test, feature = "test-util"))]
pub mod cases;
mod cedar;
mod filter;
mod glob;
mod keys;
mod prefilter;
#[cfg(test)]
mod property;

pub use cedar::{ApprovalQuestion, ApprovalRule, Policies, PolicyPin, Publication, Verdict};
pub use filter::ToolFilter;
pub use glob::ToolGlob;
pub use keys::{Environment, KeyHash, KeyTable, Scope, ToolsMode, VirtualKey, bearer_token};
pub use prefilter::{decide, prefilter, prefilter_refusal};
