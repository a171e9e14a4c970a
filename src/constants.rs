//! Names every layer shares: the tool's version and the environment switch that builds no
//! kernels. (The manifest's file name and schema version are the contract's: [`crate::contract`].)

/// The name every manifest's `generator.name` holds: what marks an output folder as this tool's.
#[cfg(feature = "codegen")]
pub const TOOL_NAME: &str = "mla-gen";

/// This mla-gen's version: in every manifest, generated header and cache key.
pub const TOOL_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Environment variable: when `1`, `Builder` builds no kernels (see `builder::ENV_SKIP`); the
/// runtime then explains why an embedded module has none.
#[cfg(any(feature = "runtime", feature = "codegen"))]
pub(crate) const ENV_SKIP: &str = "MLA_GEN_SKIP_COMPILE";
