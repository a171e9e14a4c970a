//! Bindings derived from the manifest, the only description of the kernel ABI: a C launcher
//! (`--emit c`). Each reads the manifest and the planned files; none knows the templates' insides.

use serde::Serialize;

use crate::emit::{FileSet, Manifest};
use crate::render::{RenderError, TOOL_VERSION};

pub const C_DIR: &str = "c";

const C_TEMPLATES: [(&str, &str); 2] = [
    (
        "mla_kernels.h.tera",
        include_str!("../templates/c/mla_kernels.h.tera"),
    ),
    (
        "mla_kernels.c.tera",
        include_str!("../templates/c/mla_kernels.c.tera"),
    ),
];

/// Extra outputs `generate --emit` can add.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
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
    name: &'static str,
    /// The local that holds its value for cuLaunchKernel.
    c_local: String,
}

#[derive(Serialize)]
struct CKernel<'a> {
    name: &'a str,
    dtype: &'static str,
    head_size: u32,
    elem_bytes: u32,
    out_elem_bytes: u32,
    fp8: bool,
    lse_layout: &'static str,
    prefix_threshold: bool,
    output_lse: bool,
    launch: &'a crate::abi::Launch,
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

fn c_local(name: &'static str) -> String {
    match name {
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
        other => format!("long long {other} = a->{other}"),
    }
}

/// `c/mla_kernels.h` and `c/mla_kernels.c` for the kernels of `manifest`.
pub fn c_launcher(manifest: &Manifest, files: &FileSet) -> Result<FileSet, RenderError> {
    let err = |detail: String| RenderError::Template {
        template: "c/mla_kernels".into(),
        detail,
    };
    if let Some(k) = manifest.kernels.iter().find(|k| {
        k.variant.family != crate::spec::Family::MergeAttnStates || k.variant.fp8_group.is_some()
    }) {
        return Err(err(format!(
            "the C launcher covers [[merge_attn_states]] kernels with output \"same\" or \"fp8_e4m3\" only, and the spec also has {} ({}, output \"{}\"); generate those into a folder without --emit c and launch them from the manifest",
            k.name,
            k.variant.family.table(),
            k.variant.output.name()
        )));
    }
    let mut kernels = Vec::new();
    for k in &manifest.kernels {
        let mut images = Vec::new();
        for a in &k.archs {
            let arch = crate::spec::Arch::parse(&a.arch).map_err(err)?;
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
        kernels.push(CKernel {
            name: &k.name,
            dtype: k.variant.dtype.name(),
            head_size: k.variant.head_size,
            elem_bytes: k.variant.dtype.size_bytes(),
            out_elem_bytes: k.variant.output.dtype(k.variant.dtype).size_bytes(),
            fp8: k.variant.output == crate::spec::OutputKind::Fp8E4m3,
            lse_layout: k.variant.lse_layout.name(),
            prefix_threshold: k.variant.prefix_threshold,
            output_lse: k.variant.output_lse,
            launch: &k.launch,
            params: k
                .params
                .iter()
                .map(|p| CParam {
                    name: p.name,
                    c_local: c_local(p.name),
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
