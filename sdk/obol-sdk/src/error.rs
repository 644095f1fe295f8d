//! The two ways a component may refuse a call; both reach the agent as the message given.

use std::fmt;

/// Why `prepare` produced no request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrepareError {
    /// The arguments do not describe a valid call; the message is shown to the agent.
    InvalidArguments(String),
    /// The component has no tool of that name.
    UnknownTool,
}

impl PrepareError {
    pub fn invalid(message: impl Into<String>) -> PrepareError {
        PrepareError::InvalidArguments(message.into())
    }
}

impl fmt::Display for PrepareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrepareError::InvalidArguments(message) => write!(f, "invalid arguments: {message}"),
            PrepareError::UnknownTool => f.write_str("unknown tool"),
        }
    }
}

impl std::error::Error for PrepareError {}

/// Why `interpret` produced no output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InterpretError {
    /// The vendor's response could not be understood. Keep vendor data out of the message:
    /// say what was wrong, not what the body held.
    MalformedResponse(String),
    /// The component has no tool of that name.
    UnknownTool,
}

impl InterpretError {
    pub fn malformed(message: impl Into<String>) -> InterpretError {
        InterpretError::MalformedResponse(message.into())
    }
}

impl fmt::Display for InterpretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InterpretError::MalformedResponse(message) => {
                write!(f, "malformed response: {message}")
            }
            InterpretError::UnknownTool => f.write_str("unknown tool"),
        }
    }
}

impl std::error::Error for InterpretError {}
