//! The Rust module the Builder writes for `include!` (`mla_gen_kernels.rs`): the kernels'
//! images embedded, `load(ctx)` returning a `Kernels` struct with one resolved handle per
//! kernel, one typed method per kernel over cudarc views (`mla_gen::runtime::Launch`), and
//! `select`, the runtime's generic choice of a kernel for a call. Writing it
//! needs no GPU and no cudarc (build scripts build-depend on feature `codegen` only).

use std::fmt::Write as _;
use std::path::Path;

use crate::constants::{ENV_SKIP, TOOL_VERSION};
use crate::contract::MANIFEST;
use crate::contract::{Param, ParamKind};
use crate::dtype::Dtype;
use crate::gen::spec::{self, LseLayout, OutputKind};
use crate::host::manifest::{KernelView, ManifestView};

/// What a typed binding needs to know of a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingKernel {
    pub name: String,
    pub family: spec::Family,
    pub dtype: Dtype,
    pub head_size: u32,
    pub prefix_threshold: bool,
    pub output_lse: bool,
    pub head_major: bool,
    /// Writes FP8 e4m3 codes (`u8`) with a per-tensor scale.
    pub fp8_output: bool,
    /// Writes FP8 e4m3 codes (`u8`) with per-token-group scales: (group size, UE8M0).
    pub fp8_group: Option<(u32, bool)>,
    /// Fuses the empty-context lse mask (takes the requests' start locations).
    pub mask_empty_context: bool,
    /// The parameters in signature order, with their contracts.
    pub params: Vec<Param>,
}

impl BindingKernel {
    pub fn from_variant(v: &spec::MergeVariant) -> BindingKernel {
        BindingKernel {
            name: v.kernel_name(),
            family: v.family,
            dtype: v.dtype,
            head_size: v.head_size,
            prefix_threshold: v.prefix_threshold,
            output_lse: v.output_lse,
            head_major: v.lse_layout == LseLayout::HeadMajor,
            fp8_output: v.output == OutputKind::Fp8E4m3,
            fp8_group: v.fp8_group.map(|g| (g.group_size, g.ue8m0)),
            mask_empty_context: v.mask_empty_context,
            params: crate::gen::abi::params(v),
        }
    }

    /// From a manifest as every host reads it (an entry it cannot read fails the parse).
    pub fn from_manifest(manifest: &ManifestView) -> Vec<BindingKernel> {
        manifest
            .kernels
            .iter()
            .map(BindingKernel::from_view)
            .collect()
    }

    fn from_view(k: &KernelView) -> BindingKernel {
        let v = &k.variant;
        BindingKernel {
            name: k.name.clone(),
            family: v.family,
            dtype: v.dtype,
            head_size: v.head_size,
            prefix_threshold: v.prefix_threshold,
            output_lse: v.output_lse,
            head_major: v.lse_layout == LseLayout::HeadMajor,
            fp8_output: v.output == OutputKind::Fp8E4m3,
            fp8_group: v.fp8_group.map(|g| (g.group_size, g.ue8m0)),
            mask_empty_context: v.mask_empty_context,
            params: k.params.clone(),
        }
    }

    fn doc(&self) -> String {
        let lse = if self.head_major { "[H, T]" } else { "[T, H]" };
        let yes = |b: bool| if b { "yes" } else { "no" };
        match self.family {
            spec::Family::MergeAttnStates => {
                let fp8 = match self.fp8_group {
                    Some((g, ue8m0)) => format!(
                        " into FP8 e4m3 codes, one float32 scale per {g} elements written to `output_scales`{}",
                        if ue8m0 { " (powers of two: UE8M0)" } else { "" }
                    ),
                    None if self.fp8_output => " into FP8 e4m3 codes (scale `output_scale`)".into(),
                    None => String::new(),
                };
                format!(
                    "{} rows of {}{fp8}; threshold {}; output lse {}; lse {lse}.",
                    self.dtype.name(),
                    self.head_size,
                    yes(self.prefix_threshold),
                    yes(self.output_lse),
                )
            }
            spec::Family::MergeStates { num_states } => format!(
                "merge {} states of {} rows of {}; output lse {}.",
                num_states.map_or("K (shape.num_states)".to_string(), |n| n.to_string()),
                self.dtype.name(),
                self.head_size,
                yes(self.output_lse)
            ),
            spec::Family::MergeStateInPlace { mask } => format!(
                "state := merge(state, other), {} rows of {}; lse {lse}; mask {}.",
                self.dtype.name(),
                self.head_size,
                if mask { "optional" } else { "none" }
            ),
            spec::Family::MaskEmptyContextLse => format!(
                "lse := -inf for the tokens of requests with an empty context; lse {lse}; the start locations hold B + 1 int32 each."
            ),
        }
    }

    /// The family's shape type and the integer parameters it carries.
    fn shape(&self) -> (&'static str, &'static [&'static str]) {
        const TH: [&str; 2] = ["num_tokens", "num_heads"];
        match self.family {
            spec::Family::MergeAttnStates => (
                "MergeShape",
                &[
                    TH[0],
                    TH[1],
                    "output_token_stride",
                    "output_head_stride",
                    "prefix_token_stride",
                    "prefix_head_stride",
                    "suffix_token_stride",
                    "suffix_head_stride",
                ],
            ),
            spec::Family::MergeStates { .. } => (
                "StatesShape",
                &[
                    TH[0],
                    TH[1],
                    "num_states",
                    "output_token_stride",
                    "output_head_stride",
                    "states_token_stride",
                    "states_state_stride",
                    "states_head_stride",
                ],
            ),
            spec::Family::MergeStateInPlace { .. } => (
                "InPlaceShape",
                &[
                    TH[0],
                    TH[1],
                    "state_token_stride",
                    "state_head_stride",
                    "other_token_stride",
                    "other_head_stride",
                ],
            ),
            spec::Family::MaskEmptyContextLse => ("MaskLseShape", &["num_requests", TH[0], TH[1]]),
        }
    }

    /// The typed method: one view per pointer parameter (in signature order), the family's
    /// shape, then the integers no shape carries (`Option` where the kernel has a default).
    fn method(&self) -> String {
        let (shape, shape_ints) = self.shape();
        let mut params = String::new();
        let mut body = String::new();
        let ints: Vec<&Param> = self
            .params
            .iter()
            .filter(|p| p.kind == ParamKind::I64 && !shape_ints.contains(&p.name.as_str()))
            .collect();
        let scales = ["scale_token_stride", "scale_group_stride"]
            .iter()
            .all(|s| ints.iter().any(|p| p.name == *s));
        for p in self.params.iter().filter(|p| p.kind == ParamKind::Pointer) {
            let t = rust_elem(p.elem.as_deref().unwrap_or("u8"));
            let (ty, call) = match (p.role.writes(), p.nullable) {
                (false, false) => (format!("&impl {DRV}::DevicePtr<{t}>"), "input"),
                (false, true) => (format!("Option<&dyn {DRV}::DevicePtr<{t}>>"), "input_opt"),
                (true, false) => (format!("&mut impl {DRV}::DevicePtrMut<{t}>"), "output"),
                (true, true) => (
                    format!("Option<&mut dyn {DRV}::DevicePtrMut<{t}>>"),
                    "output_opt",
                ),
            };
            let _ = write!(params, "\n        {}: {ty},", p.name);
            let _ = write!(body, "\n        l.{call}::<{t}, _>({0:?}, {0});", p.name);
        }
        let _ = write!(params, "\n        shape: {RT}::{shape},");
        let _ = write!(body, "\n        l.shape(&shape);");
        if scales {
            params.push_str(&format!(
                "\n        output_scales_layout: {RT}::ScaleLayout,"
            ));
            body.push_str("\n        l.shape(&output_scales_layout);");
        }
        for p in ints
            .iter()
            .filter(|p| !(scales && p.name.starts_with("scale_")))
        {
            if p.bounds.as_ref().is_some_and(|b| b.default.is_some()) {
                let _ = write!(params, "\n        {}: Option<usize>,", p.name);
                let _ = write!(
                    body,
                    "\n        if let Some(v) = {0} {{\n            l.int({0:?}, v);\n        }}",
                    p.name
                );
            } else {
                let _ = write!(params, "\n        {}: usize,", p.name);
                let _ = write!(body, "\n        l.int({0:?}, {0});", p.name);
            }
        }
        format!(
            "\n    /// `{name}`: {doc}\n    #[allow(clippy::too_many_arguments)]\n    pub fn {name}(\n        &self,\n        stream: &{DRV}::CudaStream,{params}\n    ) -> Result<(), {RT}::RuntimeError> {{\n        let mut l = {RT}::Launch::new(&self.{name}, stream);{body}\n        l.run()\n    }}\n",
            name = self.name,
            doc = self.doc(),
        )
    }
}

const DRV: &str = "mla_gen::cudarc::driver";
const RT: &str = "mla_gen::runtime";

/// The Rust type of a manifest element type in generated code.
fn rust_elem(elem: &str) -> String {
    match Dtype::from_name(elem) {
        Some(d @ (Dtype::F16 | Dtype::Bf16)) => format!("mla_gen::{}", d.info().rust_type),
        Some(d) => d.info().rust_type.to_string(),
        None => "u8".to_string(),
    }
}

/// The module text. `embedded`: the kernel folder and its image files; `None` builds the
/// skip-mode module (no images; `load` returns an error).
pub fn rust_module(
    kernels: &[BindingKernel],
    source: &str,
    embedded: Option<(&Path, &[String])>,
) -> String {
    let mut s = format!(
        "// Generated by mla-gen {TOOL_VERSION} from {source} (mla_gen::Builder). Do not edit; include! it.\n\
         // `load` resolves every kernel once; each method checks its arguments against the kernel's\n\
         // contract in the manifest (docs/MANIFEST.md), then launches.\n\n"
    );
    match embedded {
        Some((dir, files)) => {
            let _ = write!(
                s,
                "/// The manifest these bindings were derived from: the kernels' contracts and launch rules.\n#[allow(dead_code)]\npub const MANIFEST: &str = include_str!({:?});\n\n",
                dir.join(MANIFEST).display().to_string()
            );
            s.push_str("/// Kernel images, by their path in the manifest.\n#[allow(dead_code)]\npub const FILES: &[(&str, &[u8])] = &[\n");
            for f in files {
                let _ = writeln!(
                    s,
                    "    ({f:?}, include_bytes!({:?})),",
                    dir.join(f).display().to_string()
                );
            }
            s.push_str("];\n\n");
        }
        None => {
            let _ = write!(
                s,
                "/// Built without kernels ({}=1, or on docs.rs): none are embedded.\n#[allow(dead_code)]\npub const MANIFEST: &str = \"\";\n#[allow(dead_code)]\npub const FILES: &[(&str, &[u8])] = &[];\n\n",
                ENV_SKIP
            );
        }
    }
    let _ = write!(
        s,
        "/// Every kernel of {source}, loaded into one context: one handle per kernel.\n#[allow(dead_code)]\npub struct Kernels {{\n    /// The runtime that loaded them.\n    pub runtime: {RT}::Runtime,\n"
    );
    for k in kernels {
        let _ = writeln!(s, "    pub {}: std::sync::Arc<{RT}::Kernel>,", k.name);
    }
    let _ = write!(
        s,
        "}}\n\n/// Load every kernel into `ctx` (the CUBIN for the device's architecture, else PTX) and\n/// resolve each handle once.\n#[allow(dead_code)]\npub fn load(\n    ctx: std::sync::Arc<{DRV}::CudaContext>,\n) -> Result<Kernels, {RT}::RuntimeError> {{\n    let runtime = {RT}::Runtime::from_embedded(ctx, MANIFEST, FILES)?;\n    Ok(Kernels {{\n"
    );
    for k in kernels {
        let _ = writeln!(s, "        {0}: runtime.require({0:?})?,", k.name);
    }
    s.push_str("        runtime,\n    })\n}\n\n#[allow(dead_code)]\nimpl Kernels {");
    for k in kernels {
        s.push_str(&k.method());
    }
    let _ = write!(
        s,
        "\n    /// The kernel that serves `call` (docs/MANIFEST.md, \"Selection\"), picked at run time\n    /// from the manifest's contracts; launch it with [`{RT}::Launch`]. The error says what\n    /// each kernel of the call's family does not take.\n    pub fn select(&self, call: &{RT}::Call) -> Result<&{RT}::Kernel, {RT}::NoMatch> {{\n        self.runtime.select(call).map(|k| k.as_ref())\n    }}\n}}\n"
    );
    s
}
