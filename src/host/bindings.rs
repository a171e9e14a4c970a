//! Bindings derived from the manifest, the only description of the kernel ABI: a C launcher
//! (`--emit c`). Each reads the manifest and the planned files; none knows the templates' insides.

use serde::Serialize;

use crate::gen::emit::{FileSet, Manifest};
use crate::gen::render::{RenderError, TOOL_VERSION};
use crate::gen::spec::Family;

pub const C_DIR: &str = "c";

const C_TEMPLATES: [(&str, &str); 2] = [
    (
        "mla_kernels.h.tera",
        include_str!("../../templates/c/mla_kernels.h.tera"),
    ),
    (
        "mla_kernels.c.tera",
        include_str!("../../templates/c/mla_kernels.c.tera"),
    ),
];

/// Extra outputs `generate --emit` can add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Emit {
    /// c/mla_kernels.h + c/mla_kernels.c: embedded images and checked C launchers.
    C,
}

#[derive(Serialize)]
struct CImage {
    arch: String,
    kind: &'static str,
    /// Compute capability as a number (90 for sm_90).
    cc: u32,
    /// C condition on `cc` under which the image runs on the current device.
    runs_on: String,
    len: usize,
    bytes: String,
}

#[derive(Serialize)]
struct CParam {
    name: String,
    /// The local that holds its value for cuLaunchKernel.
    c_local: String,
}

#[derive(Serialize)]
struct CKernel<'a> {
    name: &'a str,
    /// The spec table: which argument struct and check the launcher uses.
    family: &'static str,
    args_type: &'static str,
    check: &'static str,
    /// merge_states: K (0 = runtime).
    num_states: u32,
    /// merge_states: has output lse; merge_state_in_place: takes a mask.
    flag: bool,
    mask: bool,
    dtype: &'static str,
    head_size: u32,
    elem_bytes: u32,
    out_elem_bytes: u32,
    fp8: bool,
    /// Per-token-group FP8: elements per scale (0 for other outputs) and UE8M0.
    group_size: u32,
    ue8m0: bool,
    lse_layout: &'static str,
    prefix_threshold: bool,
    output_lse: bool,
    launch: &'a crate::gen::abi::Launch,
    params: Vec<CParam>,
    /// In load order: CUBINs (newest architecture first), then PTX (newest first).
    images: Vec<CImage>,
}

fn c_bytes(bytes: &[u8]) -> String {
    bytes
        .chunks(20)
        .map(|line| {
            let cells: Vec<String> = line.iter().map(|b| format!("0x{b:02x}")).collect();
            format!("    {},", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn c_local(name: &str) -> String {
    match name {
        "states" | "other" => format!("const void* {name} = a->{name}"),
        "state" => "void* state = a->state".into(),
        "states_lse" | "other_lse" => format!("const float* {name} = a->{name}"),
        "state_lse" | "lse" => format!("float* {name} = a->{name}"),
        "mask" => "const unsigned char* mask = a->mask".into(),
        "query_start_loc" | "context_start_loc" => format!("const int32_t* {name} = a->{name}"),
        "output" => "void* output = a->output".into(),
        "output_lse" => "float* output_lse = a->output_lse".into(),
        "prefix_output" | "suffix_output" | "prefix_lse" | "suffix_lse" | "output_scale" => {
            let ty = if name.ends_with("lse") || name == "output_scale" {
                "const float*"
            } else {
                "const void*"
            };
            format!("{ty} {name} = a->{name}")
        }
        "prefill_tokens_with_context" => "long long prefill_tokens_with_context = n".into(),
        // Per-token-group FP8: the launcher's `g` holds the scales beside the merge's `a`.
        "output_scales" => "float* output_scales = g->output_scales".into(),
        "scale_token_stride" | "scale_group_stride" => format!("long long {name} = g->{name}"),
        other => format!("long long {other} = a->{other}"),
    }
}

/// `c/mla_kernels.h` and `c/mla_kernels.c` for the kernels of `manifest`.
pub fn c_launcher(manifest: &Manifest, files: &FileSet) -> Result<FileSet, RenderError> {
    let err = |detail: String| RenderError::Template {
        template: "c/mla_kernels".into(),
        detail,
    };
    let mut kernels = Vec::new();
    for k in &manifest.kernels {
        let mut images = Vec::new();
        for a in &k.archs {
            let arch = crate::gen::spec::Arch::parse(&a.arch).map_err(err)?;
            let cc = arch.major_minor;
            let (cubin_cond, ptx_cond) = if arch.arch_specific {
                (format!("cc == {cc}"), format!("cc == {cc}"))
            } else {
                (
                    format!("cc / 10 == {} && cc >= {cc}", cc / 10),
                    format!("cc >= {cc}"),
                )
            };
            let mut push = |kind: &'static str, file: &str, nul: bool, runs_on: String| {
                let mut bytes = files.get(file).cloned().unwrap_or_default();
                if nul {
                    bytes.push(0); // cuModuleLoadData takes PTX as a C string
                }
                images.push(CImage {
                    arch: a.arch.clone(),
                    kind,
                    cc,
                    runs_on,
                    len: bytes.len(),
                    bytes: c_bytes(&bytes),
                });
            };
            if let Some(c) = &a.cubin {
                push("cubin", &c.file, false, cubin_cond);
            }
            push("ptx", &a.ptx.file, true, ptx_cond);
        }
        // The order mla_load tries them in: CUBINs first, newest architecture first, then PTX.
        images.sort_by_key(|i| (i.kind != "cubin", std::cmp::Reverse(i.cc)));
        let (args_type, check, num_states, flag, mask) = match k.variant.family {
            Family::MergeAttnStates if k.variant.fp8_group.is_some() => {
                ("mla_group_fp8_args", "mla_check", 0, false, false)
            }
            Family::MergeAttnStates => ("mla_merge_args", "mla_check", 0, false, false),
            Family::MergeStates { num_states } => (
                "mla_states_args",
                "mla_check_states",
                num_states.unwrap_or(0),
                k.variant.output_lse,
                false,
            ),
            Family::MergeStateInPlace { mask } => {
                ("mla_in_place_args", "mla_check_in_place", 0, mask, mask)
            }
            Family::MaskEmptyContextLse => {
                ("mla_mask_lse_args", "mla_check_mask_lse", 0, false, false)
            }
        };
        kernels.push(CKernel {
            name: &k.name,
            family: k.variant.family.table(),
            args_type,
            check,
            num_states,
            flag,
            mask,
            dtype: k.variant.dtype.name(),
            head_size: k.variant.head_size,
            elem_bytes: k.variant.dtype.size_bytes(),
            out_elem_bytes: k.variant.output.dtype(k.variant.dtype).size_bytes(),
            fp8: k.variant.output == crate::gen::spec::OutputKind::Fp8E4m3,
            group_size: k.variant.fp8_group.map_or(0, |g| g.group_size),
            ue8m0: k.variant.fp8_group.is_some_and(|g| g.ue8m0),
            lse_layout: k.variant.lse_layout.name(),
            prefix_threshold: k.variant.prefix_threshold,
            output_lse: k.variant.output_lse,
            launch: &k.launch,
            params: k
                .params
                .iter()
                .map(|p| CParam {
                    name: p.name.clone(),
                    c_local: c_local(&p.name),
                })
                .collect(),
            images,
        });
    }
    let mut tera = tera::Tera::default();
    tera.autoescape_on(vec![]);
    tera.add_raw_templates(C_TEMPLATES.iter().copied())
        .map_err(|e| err(e.to_string()))?;
    let mut ctx = tera::Context::new();
    ctx.insert("tool_version", TOOL_VERSION);
    ctx.insert("spec_source", &manifest.spec.source);
    ctx.insert("kernels", &kernels);
    // Which helpers the C file needs: an unused static function fails -Werror.
    let has = |f: &str| kernels.iter().any(|k| k.family == f);
    let rows = has("merge_states") || has("merge_state_in_place");
    ctx.insert(
        "has",
        &serde_json::json!({
            "merge_attn_states": has("merge_attn_states"),
            "group_fp8": kernels.iter().any(|k| k.group_size != 0),
            "merge_states": has("merge_states"),
            "merge_state_in_place": has("merge_state_in_place"),
            "mask_empty_context_lse": has("mask_empty_context_lse"),
            "rows": rows,
            "extent": rows || has("merge_attn_states"),
            "other": kernels.iter().any(|k| k.family != "merge_attn_states"),
        }),
    );
    let mut out = FileSet::new();
    for (template, file) in [
        ("mla_kernels.h.tera", "mla_kernels.h"),
        ("mla_kernels.c.tera", "mla_kernels.c"),
    ] {
        let text = tera.render(template, &ctx).map_err(|e| {
            err(format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ))
        })?;
        out.insert(format!("{C_DIR}/{file}"), text.into_bytes());
    }
    Ok(out)
}
