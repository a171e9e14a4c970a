//! Helpers of the launch validation tests (tests/launch_validation.rs, the pairwise merge;
//! tests/launch_validation_families.rs, the K-way and in-place merges and the lse mask): the
//! check as a launch runs it, kernels from generated/ or from a spec, a valid pairwise call.
#![allow(dead_code)] // each test crate uses a part

use mla_gen::dtype::Dtype;
use mla_gen::reference::Layout;
use mla_gen::runtime::{Checked, DeviceBuffer, KernelView, ManifestView, MergeArgs, NamedArgs};
use mla_gen::runtime::{InPlaceArgs, MaskLseArgs, StatesArgs};

/// A family's argument struct, by name as a launch passes it.
pub trait Call {
    fn named(&self) -> NamedArgs<'static>;
}

macro_rules! call {
    ($($t:ty),*) => {$(
        impl Call for $t {
            fn named(&self) -> NamedArgs<'static> {
                self.args()
            }
        }
    )*};
}
call!(MergeArgs, StatesArgs, InPlaceArgs, MaskLseArgs);

/// The check of `args` against `k`, as a launch would run it.
pub fn validate(
    k: &KernelView,
    args: &impl Call,
) -> Result<Checked, mla_gen::runtime::RuntimeError> {
    mla_gen::runtime::validate(k, &args.named())
}

/// A generated manifest, as the runtime reads it.
pub fn view(manifest: &mla_gen::emit::Manifest) -> ManifestView {
    let text = serde_json::to_vec(manifest).unwrap();
    ManifestView::parse(std::path::Path::new("manifest.json"), &text).unwrap()
}

pub fn kernel(name: &str) -> KernelView {
    let text = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/generated/manifest.json"
    ))
    .unwrap();
    let m = ManifestView::parse(std::path::Path::new("manifest.json"), &text).unwrap();
    m.kernels.into_iter().find(|k| k.name == name).unwrap()
}

pub const T: usize = 10;
pub const H: usize = 4;
pub const D: usize = 128;

pub fn buf(base: u64, len: usize, dtype: Dtype) -> DeviceBuffer {
    DeviceBuffer {
        ptr: base,
        len,
        dtype,
    }
}

pub fn good() -> MergeArgs {
    let n = T * H * D;
    let l = Layout::contiguous(H, D);
    MergeArgs {
        output: buf(0x1000_0000, n, Dtype::Bf16),
        output_lse: Some(buf(0x2000_0000, T * H, Dtype::F32)),
        prefix: buf(0x3000_0000, n, Dtype::Bf16),
        prefix_lse: buf(0x4000_0000, T * H, Dtype::F32),
        suffix: buf(0x5000_0000, n, Dtype::Bf16),
        suffix_lse: buf(0x6000_0000, T * H, Dtype::F32),
        output_scale: None,
        output_scales: None,
        num_tokens: T,
        num_heads: H,
        output_layout: l,
        prefix_layout: l,
        suffix_layout: l,
        prefill_tokens_with_context: Some(T / 2),
    }
}

pub fn refused(k: &KernelView, a: &impl Call, needle: &str) {
    match validate(k, a) {
        Ok(_) => panic!("accepted; expected an error containing {needle:?}"),
        Err(e) => assert!(e.to_string().contains(needle), "{e}"),
    }
}
/// The manifest entry `generate` would write for each kernel of `spec_text`, without compiling.
pub fn kernels_of(spec_text: &str) -> Vec<KernelView> {
    let spec = mla_gen::spec::parse("t.toml", spec_text).unwrap();
    spec.variants
        .iter()
        .map(|v| {
            let c = mla_gen::abi::contract(v);
            serde_json::from_value(serde_json::json!({
                "name": v.kernel_name(),
                "family": v.family.table(),
                "variant": v,
                "params": c.params,
                "constants": c.constants,
                "limits": c.limits,
                "launch": c.launch,
                "select": c.select,
                "archs": [],
            }))
            .unwrap()
        })
        .collect()
}
