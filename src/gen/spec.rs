//! Spec: parse a TOML file, validate every value against its allowed set, expand lists into
//! their cross product. Errors carry `origin:line:col`, the key, the bad value and what is allowed.

use std::collections::BTreeMap;

use serde::Serialize;
use toml::Spanned;

use crate::dtype::Dtype;
pub use crate::gen::variant::*;

/// The spec compiled into the binary: what vLLM needs.
pub const DEFAULT_SPEC: &str = include_str!("../../specs/default.toml");
/// Name under which the embedded spec appears in messages and the manifest.
pub const DEFAULT_SPEC_ORIGIN: &str = "<embedded default spec>";

/// A spec may not expand to more kernels than this (a typo like `head_size = [1, ..., 1024]`
/// times every option should fail loudly, not compile for an hour).
pub const MAX_VARIANTS: usize = 4096;
pub const MAX_HEAD_SIZE: u32 = 1024;
pub const DEFAULT_ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// A validated, expanded spec.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Spec {
    /// Where it came from, for messages: a path or the embedded default.
    pub origin: String,
    /// sha256 of the spec's text.
    pub text_sha256: String,
    pub archs: Vec<Arch>,
    pub variants: Vec<MergeVariant>,
}

impl Spec {
    /// The origin without folders, as generated files name it: independent of where the spec
    /// lives, and reduced to characters that cannot end or continue a C comment (a file name may
    /// hold a newline or a trailing backslash; it must never become code).
    pub fn source_name(&self) -> String {
        let name = std::path::Path::new(&self.origin)
            .file_name()
            .map_or_else(|| self.origin.clone(), |n| n.to_string_lossy().into_owned());
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ' ' | '<' | '>')
                {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }
    pub fn kernel_names(&self) -> Vec<String> {
        self.variants.iter().map(|v| v.kernel_name()).collect()
    }
    pub fn find(&self, kernel_name: &str) -> Option<&MergeVariant> {
        self.variants
            .iter()
            .find(|v| v.kernel_name() == kernel_name)
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("{origin}:{line}:{column}: {message}")]
    At {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{origin}: {message}")]
    Whole { origin: String, message: String },
}

// ---- raw TOML shape: every value spanned so validation can point at it ----

mod raw;
use raw::*;

/// Parse, validate and expand a spec. `origin` names it in messages (a file name).
pub fn parse(origin: &str, text: &str) -> Result<Spec, SpecError> {
    let ctx = Ctx { origin, text };
    let raw: RawSpec = toml::from_str(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        ctx.at(offset, e.message().trim().to_string())
    })?;

    let archs = match &raw.arch {
        Some(v) => ctx.list("arch", v, arch)?,
        None => DEFAULT_ARCHS
            .iter()
            .map(|a| Arch::parse(a))
            .collect::<Result<_, _>>()
            .map_err(|message| SpecError::Whole {
                origin: origin.to_string(),
                message,
            })?,
    };

    let families: Vec<(Table, Spanned<RawMerge>)> = [
        (Table::Pairwise, raw.merge_attn_states),
        (Table::KWay, raw.merge_states),
        (Table::InPlace, raw.merge_state_in_place),
        (Table::MaskLse, raw.mask_empty_context_lse),
    ]
    .into_iter()
    .flat_map(|(t, tables)| tables.unwrap_or_default().into_iter().map(move |f| (t, f)))
    .collect();
    if families.is_empty() {
        return Err(SpecError::Whole {
            origin: origin.to_string(),
            message: "the spec names no kernels: add a [[merge_attn_states]], [[merge_states]], [[merge_state_in_place]] or [[mask_empty_context_lse]] table".to_string(),
        });
    }

    let mut variants: Vec<MergeVariant> = Vec::new();
    // Where the first `pdl` that sets true is, to point a refusal of the archs at it.
    let mut pdl_at: Option<usize> = None;
    // kernel name -> line of the table that produced it, to report duplicates.
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (table, family) in &families {
        let table = *table;
        let table_offset = family.span().start;
        let f = family.get_ref();
        if let Some((key, v, why)) = f.foreign_keys(table) {
            return Err(ctx.at(
                v.span().start,
                format!("`{key}` is not a key of [[{}]]: {why}", table.name()),
            ));
        }
        // The lse mask has neither (its lse is float32; the keys were refused above).
        let (dtypes, heads) = if table == Table::MaskLse {
            (vec![Dtype::F32], vec![1])
        } else {
            (
                ctx.list(
                    "dtype",
                    ctx.required(table_offset, "dtype", &f.dtype)?,
                    dtype,
                )?,
                ctx.list(
                    "head_size",
                    ctx.required(table_offset, "head_size", &f.head_size)?,
                    head_size,
                )?,
            )
        };
        let opt_list = |key: &str, v: &Option<Spanned<toml::Value>>, default: bool| match v {
            Some(v) => ctx.list(key, v, boolean),
            None => Ok(vec![default]),
        };
        // A K-way or in-place merge has no threshold (the keys were refused above).
        let thresholds = opt_list(
            "prefix_threshold",
            &f.prefix_threshold,
            table == Table::Pairwise,
        )?;
        let lses = opt_list("output_lse", &f.output_lse, table != Table::MaskLse)?;
        let ctx_masks = opt_list("mask_empty_context", &f.mask_empty_context, false)?;
        let pdls = opt_list("pdl", &f.pdl, false)?;
        let size_rule = match &f.size_rule {
            Some(v) => boolean(v.get_ref())
                .map_err(|why| ctx.at(v.span().start, format!("`size_rule`: {why}")))?,
            None => true,
        };
        let dense = match &f.dense {
            Some(v) => boolean(v.get_ref())
                .map_err(|why| ctx.at(v.span().start, format!("`dense`: {why}")))?,
            None => true,
        };
        let schedule_key = [
            &f.rows_per_thread,
            &f.min_blocks_per_sm,
            &f.block_threads,
            &f.heads_per_block,
            &f.vecs_per_thread,
        ]
        .into_iter()
        .flatten()
        .next();
        if let (Some(v), true, Some(_)) = (&f.size_rule, size_rule, schedule_key) {
            return Err(ctx.at(
                v.span().start,
                "`size_rule` = true picks among the tuned schedules, and this table sets its own schedule: remove `size_rule` or the schedule keys".to_string(),
            ));
        }
        if pdls.contains(&true) && pdl_at.is_none() {
            pdl_at = f.pdl.as_ref().map(|v| v.span().start);
        }
        let outputs = match &f.output {
            Some(v) => ctx.list("output", v, |x| one_of(&OutputKind::ALL, x))?,
            None => vec![OutputKind::Same],
        };
        // Each output kind with its group parameters: group_size and ue8m0 apply to
        // fp8_e4m3_group only, which needs group_size.
        let grouped = outputs.contains(&OutputKind::Fp8E4m3Group);
        let group_sizes = match (&f.group_size, grouped) {
            (Some(v), true) => ctx.list("group_size", v, |x| {
                match x.as_integer().and_then(|n| u32::try_from(n).ok()) {
                    Some(n) if GROUP_SIZES_ALLOWED.contains(&n) => Ok(n),
                    _ => Err(format!(
                        "{} is not allowed; allowed: 16, 32, 64, 128",
                        short(x)
                    )),
                }
            })?,
            (None, true) => {
                return Err(ctx.at(
                    table_offset,
                    "output = \"fp8_e4m3_group\" needs `group_size` (16, 32, 64 or 128)"
                        .to_string(),
                ))
            }
            (Some(v), false) => {
                return Err(ctx.at(
                    v.span().start,
                    "`group_size` applies only with output = \"fp8_e4m3_group\"".to_string(),
                ))
            }
            (None, false) => Vec::new(),
        };
        let ue8m0s = match (&f.ue8m0, grouped) {
            (Some(v), true) => ctx.list("ue8m0", v, boolean)?,
            (Some(v), false) => {
                return Err(ctx.at(
                    v.span().start,
                    "`ue8m0` applies only with output = \"fp8_e4m3_group\"".to_string(),
                ))
            }
            (None, _) => vec![false],
        };
        let mut output_choices: Vec<(OutputKind, Option<Fp8Group>)> = Vec::new();
        for &o in &outputs {
            if o == OutputKind::Fp8E4m3Group {
                for &group_size in &group_sizes {
                    for &ue8m0 in &ue8m0s {
                        output_choices.push((o, Some(Fp8Group { group_size, ue8m0 })));
                    }
                }
            } else {
                output_choices.push((o, None));
            }
        }
        let layouts = match &f.lse_layout {
            Some(v) => ctx.list("lse_layout", v, |x| one_of(&LseLayout::ALL, x))?,
            // merge_states' lse [T, K, H] is token-major by construction.
            None if table == Table::KWay => vec![LseLayout::TokenMajor],
            None => vec![LseLayout::HeadMajor],
        };
        let kinds: Vec<Family> = match table {
            Table::Pairwise => vec![Family::MergeAttnStates],
            Table::KWay => {
                let v = ctx.required(table_offset, "num_states", &f.num_states)?;
                ctx.list("num_states", v, num_states)?
                    .into_iter()
                    .map(|num_states| Family::MergeStates { num_states })
                    .collect()
            }
            Table::InPlace => match &f.mask {
                Some(v) => ctx
                    .list("mask", v, boolean)?
                    .into_iter()
                    .map(|mask| Family::MergeStateInPlace { mask })
                    .collect(),
                None => vec![Family::MergeStateInPlace { mask: false }],
            },
            Table::MaskLse => vec![Family::MaskEmptyContextLse],
        };

        let rows =
            ctx.schedule_choices("rows_per_thread", &f.rows_per_thread, "1, 2, 4, 8", |n| {
                ROWS_PER_THREAD_ALLOWED.contains(&n)
            })?;
        let mins =
            ctx.schedule_choices("min_blocks_per_sm", &f.min_blocks_per_sm, "1..=32", |n| {
                (1..=32).contains(&n)
            })?;
        let blocks = ctx.schedule_choices(
            "block_threads",
            &f.block_threads,
            "128, 256, 512, 1024",
            |n| BLOCK_THREADS_ALLOWED.contains(&n),
        )?;
        let head_groups = ctx.schedule_choices(
            "heads_per_block",
            &f.heads_per_block,
            "1, 2, 4, 8, 16, 32",
            |n| HEADS_PER_BLOCK_ALLOWED.contains(&n),
        )?;
        let vec_groups =
            ctx.schedule_choices("vecs_per_thread", &f.vecs_per_thread, "1, 2, 4", |n| {
                VECS_PER_THREAD_ALLOWED.contains(&n)
            })?;

        // Saturating: a spec of many long lists must get the error below, not an overflow.
        let count = [
            kinds.len(),
            blocks.len(),
            head_groups.len(),
            vec_groups.len(),
            dtypes.len(),
            heads.len(),
            thresholds.len(),
            ctx_masks.len(),
            lses.len(),
            output_choices.len(),
            layouts.len(),
            rows.len(),
            mins.len(),
            pdls.len(),
        ]
        .iter()
        .fold(1usize, |acc, &n| acc.saturating_mul(n));
        if variants.len().saturating_add(count) > MAX_VARIANTS {
            return Err(ctx.at(
                table_offset,
                format!(
                    "the spec expands to more than {MAX_VARIANTS} kernels; split it or shorten its lists"
                ),
            ));
        }
        let (table_line, _) = line_col(text, table_offset);
        // Schedule choices; a key the spec leaves out takes the tuned value of each variant.
        let mut schedule_choices = Vec::new();
        for &r in &rows {
            for &m in &mins {
                for &b in &blocks {
                    for &hb in &head_groups {
                        for &vt in &vec_groups {
                            schedule_choices.push((r, m, b, hb, vt));
                        }
                    }
                }
            }
        }
        // The cross product, in the order the keys are documented.
        let mut expanded = Vec::with_capacity(count);
        for &family in &kinds {
            for &dtype in &dtypes {
                for &head_size in &heads {
                    let tuned = match family {
                        Family::MergeStates { .. } => KWAY_SCHEDULE,
                        Family::MaskEmptyContextLse => MASK_SCHEDULE,
                        _ => tuned_schedule(dtype, head_size),
                    };
                    // The threshold and the fused context mask: both decide which prefix rows count.
                    let prefix_choices = thresholds
                        .iter()
                        .flat_map(|&t| ctx_masks.iter().map(move |&c| (t, c)));
                    for (prefix_threshold, mask_empty_context) in prefix_choices {
                        let tuned = if mask_empty_context {
                            fused_mask_schedule(tuned)
                        } else {
                            tuned
                        };
                        for &output_lse in &lses {
                            for &(output, fp8_group) in &output_choices {
                                for &lse_layout in &layouts {
                                    for (&(r, m, b, hb, vt), &pdl) in schedule_choices
                                        .iter()
                                        .flat_map(|s| pdls.iter().map(move |p| (s, p)))
                                    {
                                        expanded.push(MergeVariant {
                                            family,
                                            dtype,
                                            head_size,
                                            prefix_threshold,
                                            output_lse,
                                            output,
                                            fp8_group,
                                            lse_layout,
                                            schedule: Schedule {
                                                rows_per_thread: r.unwrap_or(tuned.rows_per_thread),
                                                min_blocks_per_sm: m
                                                    .unwrap_or(tuned.min_blocks_per_sm),
                                                block_threads: b.unwrap_or(tuned.block_threads),
                                                heads_per_block: hb
                                                    .unwrap_or(tuned.heads_per_block),
                                                vecs_per_thread: vt
                                                    .unwrap_or(tuned.vecs_per_thread),
                                            },
                                            explicit_schedule: r.is_some()
                                                || m.is_some()
                                                || b.is_some()
                                                || hb.is_some()
                                                || vt.is_some(),
                                            mask_empty_context,
                                            pdl,
                                            size_rule: Vec::new(),
                                            rows_below: None,
                                            dense: false,
                                            dense_specialization: false,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // The tuned size rule: its main kernel takes the largest launches' schedule, and each
        // smaller range is a kernel of its own after it.
        // Then the dense specialization of every pairwise merge kernel, right after it.
        let expanded: Vec<MergeVariant> = expanded
            .into_iter()
            .flat_map(|v| {
                let kernels = if size_rule {
                    v.with_tuned_size_rule()
                } else {
                    vec![v]
                };
                if dense {
                    MergeVariant::with_dense_twins(kernels)
                } else {
                    kernels
                }
            })
            .collect();
        for mut v in expanded {
            // The threads a block really has (whole rows); min_blocks_per_sm does not change it.
            let block = crate::gen::launch::Launch::for_variant(&v).block_threads;
            if v.mask_empty_context && f.min_blocks_per_sm.is_none() && v.dtype.size_bytes() <= 2 {
                // Full occupancy for the fused mask (variant.rs, fused_mask_schedule); float32
                // rows need more registers (d576 spilled at 32).
                v.schedule.min_blocks_per_sm = (MAX_THREADS_PER_SM / block).max(1);
            }
            if let Some(g) = v.fp8_group {
                if !group_fits(&v, g.group_size) {
                    let fits: Vec<String> = GROUP_SIZES_ALLOWED
                        .iter()
                        .filter(|&&n| group_fits(&v, n))
                        .map(|n| n.to_string())
                        .collect();
                    let offset = f
                        .group_size
                        .as_ref()
                        .map_or(table_offset, |s| s.span().start);
                    return Err(ctx.at(
                        offset,
                        format!(
                            "`group_size` = {} does not fit {} d{}: a group must divide the head size and its lanes one warp; allowed here: {}",
                            g.group_size,
                            v.dtype.name(),
                            v.head_size,
                            if fits.is_empty() { "none".to_string() } else { fits.join(", ") }
                        ),
                    ));
                }
            }
            if block * v.schedule.min_blocks_per_sm > MAX_THREADS_PER_SM {
                let offset = f
                    .min_blocks_per_sm
                    .as_ref()
                    .map_or(table_offset, |s| s.span().start);
                return Err(ctx.at(
                    offset,
                    format!(
                        "`min_blocks_per_sm` = {} with {}-thread blocks ({} d{}) exceeds {MAX_THREADS_PER_SM} threads per SM; allowed here: 1..={}",
                        v.schedule.min_blocks_per_sm,
                        block,
                        v.dtype.name(),
                        v.head_size,
                        MAX_THREADS_PER_SM / block
                    ),
                ));
            }
            // (The count above is before size rules add their kernels.)
            if variants.len() >= MAX_VARIANTS {
                return Err(ctx.at(
                    table_offset,
                    format!(
                        "the spec expands to more than {MAX_VARIANTS} kernels (size rules included); split it, shorten its lists or set size_rule = false"
                    ),
                ));
            }
            let name = v.kernel_name();
            if let Some(first) = seen.insert(name.clone(), table_line) {
                return Err(ctx.at(
                    table_offset,
                    format!(
                        "kernel `{name}` is also produced by the table at line {first}; each kernel may appear once"
                    ),
                ));
            }
            variants.push(v);
        }
    }

    if let (Some(offset), Some(problem)) = (pdl_at, pdl_arch_problem(&archs)) {
        return Err(ctx.at(offset, problem));
    }
    Ok(Spec {
        origin: origin.to_string(),
        text_sha256: crate::gen::sha256_hex(text.as_bytes()),
        archs,
        variants,
    })
}

/// Can `v`'s rows be split into groups of `group_size` elements whose lanes sit in one warp? The
/// group's scale is a shuffle reduction over those lanes, so: the group divides the row and holds
/// whole vectors, its lanes (a power of two up to 32) divide the threads of a row, and every
/// thread walks whole rows (no partial last pass).
pub(crate) fn group_fits(v: &MergeVariant, group_size: u32) -> bool {
    let l = crate::gen::launch::Launch::for_variant(v);
    let lanes = group_size / l.vec_elems.max(1);
    v.head_size % group_size == 0
        && group_size % l.vec_elems == 0
        && (1..=32).contains(&lanes)
        && l.threads_per_row % lanes == 0
        && l.vecs_per_row % l.threads_per_row == 0
}

/// Why `archs` cannot carry a `pdl = true` kernel, if they cannot. Every device of compute
/// capability 9.0 or newer must run an image built for sm_90 or newer (the one with
/// `griddepcontrol.wait` compiled in), since hosts decide the launch by the device alone: so some
/// target must be sm_90+, and a PTX below sm_90 (which such a device could fall back to under the
/// artifact rule) needs a plain sm_90 or compute_90 beside it.
pub(crate) fn pdl_arch_problem(archs: &[Arch]) -> Option<String> {
    let names = || archs.iter().map(Arch::name).collect::<Vec<_>>().join(", ");
    if archs.iter().all(|a| a.major_minor < 90) {
        return Some(format!(
            "`pdl` = true needs a target of sm_90 or newer (programmatic dependent launch and griddepcontrol exist from sm_90 on), and this spec targets only {}: add \"sm_90\" to `arch` (older targets may stay; they launch without it), or remove `pdl`",
            names()
        ));
    }
    let plain = |a: &&Arch| !a.arch_specific;
    let old_ptx = archs.iter().filter(plain).find(|a| a.major_minor < 90);
    match old_ptx {
        Some(old) if !archs.iter().filter(plain).any(|a| a.major_minor == 90) => Some(format!(
            "`pdl` = true with targets {}: a device of compute capability 9.0 or newer with no image of its own would run the {} PTX, which cannot wait for the previous kernel; add \"sm_90\" to `arch`",
            names(),
            old.virtual_name()
        )),
        _ => None,
    }
}

/// The embedded default spec, parsed.
pub fn default_spec() -> Result<Spec, SpecError> {
    parse(DEFAULT_SPEC_ORIGIN, DEFAULT_SPEC)
}

/// Environment variable: comma-separated architectures replacing a spec's.
pub const ENV_ARCH: &str = "MLA_GEN_ARCH";

/// Apply the architecture override in force: `explicit` (a `--arch` flag or `Builder::archs`)
/// when given, else `MLA_GEN_ARCH` when set, else the spec's own.
pub fn apply_arch_override(spec: &mut Spec, explicit: Option<&[String]>) -> Result<(), SpecError> {
    if let Some(archs) = explicit.filter(|a| !a.is_empty()) {
        return override_archs(spec, archs);
    }
    let from_env: Vec<String> = std::env::var(ENV_ARCH)
        .map(|v| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if from_env.is_empty() {
        Ok(())
    } else {
        override_archs(spec, &from_env)
    }
}

/// Replace the spec's architectures (from `--arch` or an environment variable).
pub(crate) fn override_archs(spec: &mut Spec, archs: &[String]) -> Result<(), SpecError> {
    let mut out = Vec::new();
    for a in archs {
        let parsed = Arch::parse(a).map_err(|message| SpecError::Whole {
            origin: "--arch".to_string(),
            message,
        })?;
        if !out.contains(&parsed) {
            out.push(parsed);
        }
    }
    if out.is_empty() {
        return Err(SpecError::Whole {
            origin: "--arch".to_string(),
            message: "no architecture given".to_string(),
        });
    }
    if spec.variants.iter().any(|v| v.pdl) {
        if let Some(message) = pdl_arch_problem(&out) {
            return Err(SpecError::Whole {
                origin: "--arch".to_string(),
                message,
            });
        }
    }
    spec.archs = out;
    Ok(())
}

#[cfg(test)]
mod tests;
