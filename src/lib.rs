//! mla-gen: spec-driven, ahead-of-time CUDA for attention-state merges.
//!
//! A stack, each layer importing only those under it (`scripts/structure.py` checks it):
//! - the ground floor, shared by all: [`contract`] (the argument contract, as data), [`dtype`],
//!   [`variant`] (what a kernel was generated with), [`error`], `constants`,
//!   and [`mod@reference`] (the float64 semantics every kernel must match);
//! - `gen` (feature `codegen`): spec -> variants -> ABI -> CUDA source -> NVRTC -> files and
//!   manifest, one stage a module;
//! - [`host`]: the typed manifest and the launch checker (always), the runtime that loads and
//!   launches (feature `runtime`);
//! - `writers` (`codegen`): the C launcher and the Rust module, written from a manifest;
//! - `generate` and `builder` (`codegen`): a whole generation, and the build.rs API.
//!
//! Features: `runtime` (load and launch: cudarc, serde, thiserror, half), `codegen` (generation
//! and `Builder` for build scripts, no cudarc), `cli` (the binary; both
//! of them, the default). An engine depends on `runtime` and build-depends on `codegen`. With
//! neither, the crate is the manifest's types and the launch checker ([`contract`],
//! [`host::check`], [`host::manifest`], [`variant`], [`dtype`], [`mod@reference`]).

// No panics reachable from user input: errors are typed and returned (tests may unwrap).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

#[cfg(feature = "codegen")]
pub mod builder;
mod constants;
pub mod contract;
pub mod dtype;
pub mod error;
#[cfg(feature = "codegen")]
pub mod gen;
#[cfg(feature = "codegen")]
mod generate;
pub mod host;
pub mod reference;
pub mod variant;
#[cfg(feature = "codegen")]
pub mod writers;

// The stages under their short paths (`mla_gen::spec`, `mla_gen::runtime`, ...).
#[cfg(feature = "codegen")]
pub use gen::{abi, compile, emit, nvrtc, render, spec};
// The GPU timing behind `mla-gen tune` and `mla-gen bench`: the CLI's, not an API.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub use host::bench;
#[cfg(feature = "runtime")]
pub use host::{driver, runtime};
#[cfg(feature = "codegen")]
pub use writers::bindings;

#[cfg(feature = "codegen")]
pub use builder::Builder;

/// The cudarc and half versions the runtime and generated bindings use, for engines to share.
#[cfg(feature = "runtime")]
pub use cudarc;
pub use half;

pub use constants::TOOL_VERSION;
#[cfg(feature = "codegen")]
pub use generate::{generate_files, generate_files_with, generate_files_with_c_prefix, Error};
