//! Generation, one stage a module:
//! [`spec`] (parse, validate, expand into [`variant`]s) -> [`abi`] (each kernel's argument
//! contract; its thread geometry and grid rule in [`launch`]) -> [`render`] (Tera -> CUDA) ->
//! [`compile`] ([`nvrtc`] -> PTX, CUBIN) -> [`emit`] (files, manifest). A stage imports only
//! those before it, except that `spec` reads `launch` (a variant's block size, to validate its
//! schedule) and `variant`'s types: `scripts/structure.py` holds the exact order.

pub mod abi;
pub mod compile;
pub mod emit;
pub mod launch;
pub mod nvrtc;
pub mod render;
pub mod spec;
pub mod variant;

use sha2::{Digest, Sha256};

/// Lower-case hex sha256 of `bytes` (file hashes, cache keys, the spec's hash).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
