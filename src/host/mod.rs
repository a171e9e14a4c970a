//! The hosts' side: what loads and launches generated kernels. The C launcher emitter
//! ([`bindings`], [`c`]), the Rust module writer ([`rust_module`]) and the checker ([`check`])
//! need no GPU; the runtime (`runtime` and its layers `manifest`, `load`, `launch`, `typed`) and
//! the benchmarks need feature `cuda`.

pub mod bindings;
pub mod c;
pub mod check;
pub mod driver;
pub mod rust_module;

#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod launch;
#[cfg(feature = "cuda")]
pub mod load;
#[cfg(feature = "cuda")]
pub mod manifest;
#[cfg(feature = "cuda")]
pub mod runtime;
#[cfg(feature = "cuda")]
pub mod typed;
