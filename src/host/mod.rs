//! The hosts' side: what loads and launches generated kernels. The C launcher emitter
//! ([`bindings`], [`c`]) needs no GPU; the runtime and benchmarks need feature `cuda`.

pub mod bindings;
pub mod c;
pub mod check;
pub mod driver;

#[cfg(feature = "cuda")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod runtime;
