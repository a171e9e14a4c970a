//! Render: one variant -> self-contained CUDA source, through Tera templates embedded in the
//! binary (or read from a directory, for template development).

use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

// Tera nests the useful message in an error's source chain: errors keep it (with_sources).
use crate::error::with_sources;
use crate::gen::abi::{self, Launch, Param};
use crate::gen::hex;
pub use crate::gen::sha256_hex;
use crate::gen::variant::{Family, MergeVariant};

/// Templates compiled into the binary: (name, text). Their bytes feed every artifact's hash.
pub const EMBEDDED_TEMPLATES: [(&str, &str); 5] = [
    (
        "prelude.cu.tera",
        include_str!("../../templates/prelude.cu.tera"),
    ),
    (
        "merge_attn_states.cu.tera",
        include_str!("../../templates/merge_attn_states.cu.tera"),
    ),
    (
        "merge_states.cu.tera",
        include_str!("../../templates/merge_states.cu.tera"),
    ),
    (
        "merge_state_in_place.cu.tera",
        include_str!("../../templates/merge_state_in_place.cu.tera"),
    ),
    (
        "mask_empty_context_lse.cu.tera",
        include_str!("../../templates/mask_empty_context_lse.cu.tera"),
    ),
];

pub use crate::constants::TOOL_VERSION;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    #[error("cannot read template {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("template error in {template}: {detail}")]
    Template { template: String, detail: String },
}

/// The template set in use.
#[derive(Debug, Clone)]
pub struct Templates {
    /// (name, text) sorted by name.
    sources: Vec<(String, String)>,
    tera: tera::Tera,
}

impl Templates {
    pub fn embedded() -> Result<Templates, RenderError> {
        Self::from_sources(
            EMBEDDED_TEMPLATES
                .iter()
                .map(|(n, t)| (n.to_string(), t.to_string()))
                .collect(),
        )
    }

    /// Templates from a directory (`--templates DIR`): the same file names as the embedded set.
    pub fn from_dir(dir: &Path) -> Result<Templates, RenderError> {
        let mut sources = Vec::new();
        for (name, _) in EMBEDDED_TEMPLATES {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path)
                .map_err(|source| RenderError::Read { path, source })?;
            sources.push((name.to_string(), text));
        }
        Self::from_sources(sources)
    }

    fn from_sources(mut sources: Vec<(String, String)>) -> Result<Templates, RenderError> {
        sources.sort();
        let mut tera = tera::Tera::default();
        tera.autoescape_on(vec![]);
        tera.add_raw_templates(sources.iter().map(|(n, t)| (n.as_str(), t.as_str())))
            .map_err(|e| RenderError::Template {
                template: "(template set)".to_string(),
                detail: with_sources(&e),
            })?;
        Ok(Templates { sources, tera })
    }

    /// sha256 over every template's name and bytes.
    pub fn sha256(&self) -> String {
        let mut h = Sha256::new();
        for (name, text) in &self.sources {
            h.update((name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update((text.len() as u64).to_le_bytes());
            h.update(text.as_bytes());
        }
        hex(&h.finalize())
    }

    pub fn render(&self, origin: &str, v: &MergeVariant) -> Result<String, RenderError> {
        let template = format!("{}.cu.tera", v.family.table());
        let ctx = Context::new(origin, v);
        let ctx = tera::Context::from_serialize(&ctx).map_err(|e| RenderError::Template {
            template: template.clone(),
            detail: with_sources(&e),
        })?;
        let text = self
            .tera
            .render(&template, &ctx)
            .map_err(|e| RenderError::Template {
                template: template.clone(),
                detail: with_sources(&e),
            })?;
        Ok(tidy(&text))
    }
}

/// What the templates see.
#[derive(Serialize)]
struct Context {
    kernel_name: String,
    /// The spec table (and template): merge_attn_states, merge_states, merge_state_in_place or
    /// mask_empty_context_lse.
    family: &'static str,
    /// merge_states: K (0 with runtime_k).
    num_states: u32,
    runtime_k: bool,
    /// merge_state_in_place: takes a per-token mask.
    mask: bool,
    /// output = fp8_e4m3_group: elements per scale (0 otherwise) and UE8M0 rounding.
    group_size: u32,
    ue8m0: bool,
    tool_version: &'static str,
    spec_origin: String,
    dtype: &'static str,
    head_size: u32,
    prefix_threshold: bool,
    output_lse: bool,
    output: &'static str,
    lse_layout: &'static str,
    launch: Launch,
    params: Vec<Param>,
    /// Every option of the variant as the manifest writes it (`variant.mask_empty_context`): an
    /// option a template reads needs no new field here.
    variant: MergeVariant,
}

impl Context {
    fn new(origin: &str, v: &MergeVariant) -> Context {
        Context {
            kernel_name: v.kernel_name(),
            family: v.family.table(),
            num_states: match v.family {
                Family::MergeStates { num_states } => num_states.unwrap_or(0),
                _ => 0,
            },
            runtime_k: v.family == Family::MergeStates { num_states: None },
            mask: v.family == Family::MergeStateInPlace { mask: true },
            group_size: v.fp8_group.map_or(0, |g| g.group_size),
            ue8m0: v.fp8_group.is_some_and(|g| g.ue8m0),
            tool_version: TOOL_VERSION,
            spec_origin: origin.to_string(),
            dtype: v.dtype.name(),
            head_size: v.head_size,
            prefix_threshold: v.prefix_threshold,
            output_lse: v.output_lse,
            output: v.output.name(),
            lse_layout: v.lse_layout.name(),
            launch: Launch::for_variant(v),
            params: abi::params(v),
            variant: v.clone(),
        }
    }
}

/// Strip trailing spaces and collapse runs of blank lines left by template conditionals, so the
/// output reads as hand-formatted code.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}
