//! The writers of bindings (feature `codegen`): files derived from a manifest, for hosts to
//! compile. Beside `gen/` (which makes the kernels and the manifest) and above `host/` (whose
//! typed manifest they read); none knows the templates' insides.
//!
//! - [`bindings`]: the public entry (`generate --emit c`): the C launcher, written by `c.rs`
//!   (tables interpreted by the template's one generic check and loader);
//! - `rust_module`: the module the `Builder` writes for `include!` (typed methods over the
//!   runtime's `Launch`, and `dispatch`).

pub mod bindings;
pub(crate) mod c;
pub(crate) mod rust_module;
