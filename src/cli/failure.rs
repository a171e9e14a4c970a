//! The binary's one error: a message and an exit code, from anything displayable.

/// A failure to report: message, exit code.
pub struct Failure(pub String, pub u8);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure(e.to_string(), 1)
    }
}
