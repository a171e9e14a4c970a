//! The hosts' side in Rust: what reads a manifest, checks arguments and loads and launches
//! generated kernels. A stack, each layer importing only those under it:
//!
//! - always (no GPU, serde only): [`check`], the one launch checker over a manifest's argument
//!   contract; [`manifest`], the typed manifest every Rust reader uses; [`select`], which
//!   kernel serves a call, from the manifest's contracts;
//! - feature `runtime`: `driver` (the driver probe), `args` (arguments by name and the
//!   per-family argument and shape structs), `kernel` (one loaded kernel and its launches),
//!   `load` (`Runtime`), `typed` (the safe launch over cudarc views) and
//!   `runtime`, the façade that makes them public;
//! - feature `cli`: `bench`, the GPU timing behind `mla-gen tune` and `mla-gen bench`.
//!
//! The errors are under all of them ([`crate::error`]); the writers of bindings (C launcher,
//! Rust module) are codegen and live in `src/writers/`.

pub mod check;
pub mod manifest;
pub mod select;

#[cfg(feature = "runtime")]
pub(crate) mod args;
#[cfg(feature = "runtime")]
pub mod driver;
#[cfg(feature = "runtime")]
pub(crate) mod kernel;
#[cfg(feature = "runtime")]
pub(crate) mod load;
#[cfg(feature = "runtime")]
pub mod runtime;
#[cfg(feature = "runtime")]
pub(crate) mod typed;

#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod bench;
