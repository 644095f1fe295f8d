//! The one capability a component is given: writing to the host's log.
//!
//! Outside WebAssembly (a connector's native unit tests) there is no host, so messages go
//! to stderr instead of reaching an import that does not exist there.

/// How much a message matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// Writes one message to the host's log. The host may shorten or drop messages.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    {
        use crate::bindings::obol::connector::log as imported;
        let level = match level {
            Level::Debug => imported::Level::Debug,
            Level::Info => imported::Level::Info,
            Level::Warn => imported::Level::Warn,
        };
        imported::log(level, message);
    }
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[obol {level:?}] {message}");
}

pub fn debug(message: &str) {
    log(Level::Debug, message);
}

pub fn info(message: &str) {
    log(Level::Info, message);
}

pub fn warn(message: &str) {
    log(Level::Warn, message);
}
