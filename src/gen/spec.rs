//! Spec: parse a TOML file, validate every value against its allowed set, expand lists into
//! their cross product. Errors carry `origin:line:col`, the key, the bad value and what is allowed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    arch: Option<Spanned<toml::Value>>,
    merge_attn_states: Option<Vec<Spanned<RawMerge>>>,
    merge_states: Option<Vec<Spanned<RawMerge>>>,
    merge_state_in_place: Option<Vec<Spanned<RawMerge>>>,
    mask_empty_context_lse: Option<Vec<Spanned<RawMerge>>>,
}

/// (key, its value, the tables it belongs to, why it is refused in the others)
type KeyRule<'a> = (
    &'static str,
    &'a Option<Spanned<toml::Value>>,
    &'static [Table],
    &'static str,
);

/// Which table a `RawMerge` came from; decides which keys it may hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Table {
    Pairwise,
    KWay,
    InPlace,
    MaskLse,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Pairwise => "merge_attn_states",
            Table::KWay => "merge_states",
            Table::InPlace => "merge_state_in_place",
            Table::MaskLse => "mask_empty_context_lse",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMerge {
    dtype: Option<Spanned<toml::Value>>,
    head_size: Option<Spanned<toml::Value>>,
    prefix_threshold: Option<Spanned<toml::Value>>,
    output_lse: Option<Spanned<toml::Value>>,
    output: Option<Spanned<toml::Value>>,
    lse_layout: Option<Spanned<toml::Value>>,
    rows_per_thread: Option<Spanned<toml::Value>>,
    min_blocks_per_sm: Option<Spanned<toml::Value>>,
    block_threads: Option<Spanned<toml::Value>>,
    heads_per_block: Option<Spanned<toml::Value>>,
    /// merge_states only: K values (integers 2..=16) and/or "runtime".
    num_states: Option<Spanned<toml::Value>>,
    /// merge_state_in_place only: a per-token mask argument.
    mask: Option<Spanned<toml::Value>>,
    /// output = "fp8_e4m3_group" only: elements per scale (16, 32, 64, 128).
    group_size: Option<Spanned<toml::Value>>,
    /// output = "fp8_e4m3_group" only: scales rounded up to powers of two.
    ue8m0: Option<Spanned<toml::Value>>,
    /// merge_attn_states only: the empty-context lse mask fused into the merge.
    mask_empty_context: Option<Spanned<toml::Value>>,
}

impl RawMerge {
    /// Keys that mean nothing in `table`, with why, so a spec cannot set an option that would be
    /// silently ignored.
    fn foreign_keys(
        &self,
        table: Table,
    ) -> Option<(&'static str, &Spanned<toml::Value>, &'static str)> {
        use Table::*;
        // (key, its value, the tables it belongs to, why elsewhere it is refused)
        const MERGES: &[Table] = &[Pairwise, KWay, InPlace];
        let keys: [KeyRule; 15] = [
            (
                "group_size",
                &self.group_size,
                &[Pairwise],
                "per-token-group FP8 belongs to [[merge_attn_states]] with output = \"fp8_e4m3_group\"",
            ),
            (
                "ue8m0",
                &self.ue8m0,
                &[Pairwise],
                "per-token-group FP8 belongs to [[merge_attn_states]] with output = \"fp8_e4m3_group\"",
            ),
            (
                "dtype",
                &self.dtype,
                MERGES,
                "the lse mask works on float32 lse of any merge",
            ),
            (
                "head_size",
                &self.head_size,
                MERGES,
                "the lse mask works on lse, which has no head size",
            ),
            (
                "min_blocks_per_sm",
                &self.min_blocks_per_sm,
                MERGES,
                "the lse mask has a fixed launch shape",
            ),
            (
                "block_threads",
                &self.block_threads,
                MERGES,
                "the lse mask has a fixed launch shape",
            ),
            (
                "heads_per_block",
                &self.heads_per_block,
                MERGES,
                "the lse mask has a fixed launch shape",
            ),
            (
                "num_states",
                &self.num_states,
                &[KWay],
                "K belongs to [[merge_states]]",
            ),
            (
                "mask",
                &self.mask,
                &[InPlace],
                "a mask belongs to [[merge_state_in_place]]",
            ),
            (
                "mask_empty_context",
                &self.mask_empty_context,
                &[Pairwise],
                "the fused empty-context mask belongs to [[merge_attn_states]] (a separate [[mask_empty_context_lse]] serves the others)",
            ),
            (
                "prefix_threshold",
                &self.prefix_threshold,
                &[Pairwise],
                "only the pairwise merge has a threshold (an in-place merge can use `mask`)",
            ),
            (
                "output",
                &self.output,
                &[Pairwise],
                "only the pairwise merge has output kinds; this one writes its input dtype",
            ),
            (
                "lse_layout",
                &self.lse_layout,
                &[Pairwise, InPlace, MaskLse],
                "merge_states' lse is [T, K, H] in and [T, H] out",
            ),
            (
                "output_lse",
                &self.output_lse,
                &[Pairwise, KWay],
                "only the pairwise and K-way merges write a separate output lse",
            ),
            (
                "rows_per_thread",
                &self.rows_per_thread,
                &[Pairwise, InPlace],
                "only the pairwise and in-place merges take it (a K-way merge keeps its K rows in flight)",
            ),
        ];
        keys.into_iter().find_map(|(key, value, home, why)| {
            value
                .as_ref()
                .filter(|_| !home.contains(&table))
                .map(|v| (key, v, why))
        })
    }
}

struct Ctx<'a> {
    origin: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    fn at(&self, offset: usize, message: String) -> SpecError {
        let (line, column) = line_col(self.text, offset);
        SpecError::At {
            origin: self.origin.to_string(),
            line,
            column,
            message,
        }
    }

    fn required<'v>(
        &self,
        table_offset: usize,
        key: &str,
        value: &'v Option<Spanned<toml::Value>>,
    ) -> Result<&'v Spanned<toml::Value>, SpecError> {
        value.as_ref().ok_or_else(|| {
            self.at(
                table_offset,
                format!("this table is missing the required key `{key}`"),
            )
        })
    }

    /// A schedule key: absent means `[None]` (each variant takes its tuned value), else every
    /// listed integer that `ok` accepts.
    fn schedule_choices(
        &self,
        key: &str,
        value: &Option<Spanned<toml::Value>>,
        allowed: &str,
        ok: impl Fn(u32) -> bool,
    ) -> Result<Vec<Option<u32>>, SpecError> {
        let Some(value) = value else {
            return Ok(vec![None]);
        };
        let parse = |v: &toml::Value| match v.as_integer().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if ok(n) => Ok(Some(n)),
            _ => Err(format!("{} is not allowed; allowed: {allowed}", short(v))),
        };
        self.list(key, value, parse)
    }

    /// A scalar or a list of scalars, each checked by `one`; lists may not be empty or repeat.
    fn list<T: PartialEq>(
        &self,
        key: &str,
        value: &Spanned<toml::Value>,
        one: impl Fn(&toml::Value) -> Result<T, String>,
    ) -> Result<Vec<T>, SpecError> {
        let offset = value.span().start;
        let items: Vec<&toml::Value> = match value.get_ref() {
            toml::Value::Array(items) => items.iter().collect(),
            scalar => vec![scalar],
        };
        if items.is_empty() {
            return Err(self.at(
                offset,
                format!("`{key}` is an empty list: give at least one value"),
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let parsed = one(item).map_err(|why| self.at(offset, format!("`{key}`: {why}")))?;
            if out.contains(&parsed) {
                return Err(self.at(offset, format!("`{key}` lists {} twice", short(item))));
            }
            out.push(parsed);
        }
        Ok(out)
    }
}

fn short(v: &toml::Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = text.get(..offset).unwrap_or_default();
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(before.chars().count(), |nl| {
        before[nl + 1..].chars().count()
    }) + 1;
    (line, column)
}

fn one_of<T: Copy>(key_values: &[(&'static str, T)], v: &toml::Value) -> Result<T, String> {
    let allowed: Vec<&str> = key_values.iter().map(|(k, _)| *k).collect();
    match v.as_str() {
        Some(s) => key_values
            .iter()
            .find(|(k, _)| *k == s)
            .map(|(_, t)| *t)
            .ok_or_else(|| format!("\"{s}\" is not allowed; allowed: {}", allowed.join(", "))),
        None => Err(format!(
            "expected a string, got {}; allowed: {}",
            short(v),
            allowed.join(", ")
        )),
    }
}

fn boolean(v: &toml::Value) -> Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("expected true or false, got {}", short(v)))
}

fn head_size(v: &toml::Value) -> Result<u32, String> {
    match v.as_integer() {
        Some(n) if (1..=i64::from(MAX_HEAD_SIZE)).contains(&n) => Ok(n as u32),
        Some(n) => Err(format!("{n} is out of range; allowed: 1..={MAX_HEAD_SIZE}")),
        None => Err(format!(
            "expected an integer in 1..={MAX_HEAD_SIZE}, got {}",
            short(v)
        )),
    }
}

fn dtype(v: &toml::Value) -> Result<Dtype, String> {
    let allowed = Dtype::allowed_names().join(", ");
    match v.as_str() {
        Some(s) => Dtype::input_from_name(s).ok_or_else(|| {
            let hint = if s == "fp8_e4m3" {
                " (fp8 is an output: write output = \"fp8_e4m3\")"
            } else {
                ""
            };
            format!("\"{s}\" is not allowed; allowed: {allowed}{hint}")
        }),
        None => Err(format!(
            "expected a string, got {}; allowed: {allowed}",
            short(v)
        )),
    }
}

/// One `num_states` entry: a compile-time K, or "runtime" (K is a launch argument).
fn num_states(v: &toml::Value) -> Result<Option<u32>, String> {
    let allowed = format!("integers 2..={MAX_NUM_STATES}, or \"runtime\"");
    match v {
        toml::Value::Integer(n) if (2..=i64::from(MAX_NUM_STATES)).contains(n) => {
            Ok(Some(*n as u32))
        }
        toml::Value::String(s) if s == "runtime" => Ok(None),
        _ => Err(format!("{} is not allowed; allowed: {allowed}", short(v))),
    }
}

fn arch(v: &toml::Value) -> Result<Arch, String> {
    match v.as_str() {
        Some(s) => Arch::parse(s),
        None => Err(format!(
            "expected a string such as \"sm_90\", got {}",
            short(v)
        )),
    }
}

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
        let head_groups =
            ctx.schedule_choices("heads_per_block", &f.heads_per_block, "1, 2, 4, 8", |n| {
                HEADS_PER_BLOCK_ALLOWED.contains(&n)
            })?;

        // Saturating: a spec of many long lists must get the error below, not an overflow.
        let count = [
            kinds.len(),
            blocks.len(),
            head_groups.len(),
            dtypes.len(),
            heads.len(),
            thresholds.len(),
            ctx_masks.len(),
            lses.len(),
            output_choices.len(),
            layouts.len(),
            rows.len(),
            mins.len(),
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
                        schedule_choices.push((r, m, b, hb));
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
                        for &output_lse in &lses {
                            for &(output, fp8_group) in &output_choices {
                                for &lse_layout in &layouts {
                                    for &(r, m, b, hb) in &schedule_choices {
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
                                            },
                                            explicit_schedule: r.is_some()
                                                || m.is_some()
                                                || b.is_some()
                                                || hb.is_some(),
                                            mask_empty_context,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for v in expanded {
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
            let block = crate::gen::abi::Launch::for_variant(&v).block_threads;
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
    let l = crate::gen::abi::Launch::for_variant(v);
    let lanes = group_size / l.vec_elems.max(1);
    v.head_size % group_size == 0
        && group_size % l.vec_elems == 0
        && (1..=32).contains(&lanes)
        && l.threads_per_row % lanes == 0
        && l.vecs_per_row % l.threads_per_row == 0
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
    spec.archs = out;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse("t.toml", text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_fused_context_mask_is_a_pairwise_key() {
        let s = parse(
            "t.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nmask_empty_context = [false, true]\n",
        )
        .unwrap();
        let names = s.kernel_names();
        assert_eq!(
            names,
            [
                "merge_attn_states_bf16_d128_thr_lse",
                "merge_attn_states_bf16_d128_thr_lse_ctxmask"
            ]
        );
        let p = crate::gen::abi::params(&s.variants[1]);
        let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
        assert!(names.contains(&"query_start_loc") && names.contains(&"context_start_loc"));
        assert_eq!(names.last(), Some(&"num_requests"));
        for table in [
            "merge_states",
            "merge_state_in_place",
            "mask_empty_context_lse",
        ] {
            let text = format!("[[{table}]]\nmask_empty_context = true\n");
            let e = parse("t.toml", &text).unwrap_err().to_string();
            assert!(e.contains("`mask_empty_context` is not a key of"), "{e}");
        }
        let e = parse(
            "t.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nmask_empty_context = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("t.toml:4:"), "{e}");
    }

    #[test]
    fn default_spec_is_the_vllm_set() {
        let s = default_spec().unwrap();
        assert_eq!(s.variants.len(), 27);
        assert_eq!(
            s.archs.iter().map(Arch::name).collect::<Vec<_>>(),
            ["sm_80", "sm_90", "sm_100", "sm_120"]
        );
        assert!(s
            .variants
            .iter()
            .all(|v| v.prefix_threshold && v.output_lse));
        let heads: std::collections::BTreeSet<u32> =
            s.variants.iter().map(|v| v.head_size).collect();
        assert_eq!(
            heads.into_iter().collect::<Vec<_>>(),
            [64, 80, 96, 112, 128, 192, 256, 512, 576]
        );
    }

    #[test]
    fn lists_expand_to_their_cross_product_in_order() {
        let s = parse(
            "t.toml",
            "[[merge_attn_states]]\ndtype = [\"f16\", \"bf16\"]\nhead_size = [64, 128]\nprefix_threshold = [true, false]\n",
        )
        .unwrap();
        let names = s.kernel_names();
        assert_eq!(names.len(), 8);
        assert_eq!(names[0], "merge_attn_states_f16_d64_thr_lse");
        assert_eq!(names[1], "merge_attn_states_f16_d64_lse");
        assert_eq!(names[7], "merge_attn_states_bf16_d128_lse");
        assert_eq!(s.archs.len(), 2, "default archs");
    }

    #[test]
    fn errors_name_the_place_the_key_and_the_allowed_values() {
        assert_eq!(
            err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 0\n"),
            "t.toml:3:13: `head_size`: 0 is out of range; allowed: 1..=1024"
        );
        assert!(
            err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\noutput = \"fp4\"\n")
                .contains("\"fp4\" is not allowed; allowed: same")
        );
        assert!(err("[[merge_attn_states]]\ndtype = []\nhead_size = 64\n").contains("empty list"));
        assert!(
            err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = [64, 64]\n")
                .contains("lists 64 twice")
        );
        assert!(err(
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\noutput_lse = \"yes\"\n"
        )
        .contains("expected true or false"));
        assert!(err(
            "arch = [\"sm_9x\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n"
        )
        .contains("must be digits"));
        assert!(err(
            "arch = [\"gfx90a\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n"
        )
        .contains("not an architecture"));
        assert!(err("").contains("names no kernels"));
        assert!(err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n")
            .contains("also produced by the table at line 1"));
    }

    #[test]
    fn fp8_is_an_output_kind_not_an_input_dtype() {
        let e = err("[[merge_attn_states]]\ndtype = \"fp8_e4m3\"\nhead_size = 64\n");
        assert!(e.contains("write output = \"fp8_e4m3\""), "{e}");
        let s = parse(
            "t.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\noutput = [\"same\", \"fp8_e4m3\"]\n",
        )
        .unwrap();
        assert_eq!(
            s.kernel_names(),
            [
                "merge_attn_states_bf16_d64_thr_lse",
                "merge_attn_states_bf16_d64_thr_lse_fp8"
            ]
        );
    }

    #[test]
    fn k_way_and_in_place_tables() {
        let s = parse(
            "t.toml",
            "[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\nnum_states = [2, 16, \"runtime\"]\noutput_lse = [true, false]\n\
             [[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 64\nmask = [true, false]\nlse_layout = \"token_major\"\n",
        )
        .unwrap();
        assert_eq!(
            s.kernel_names(),
            [
                "merge_states_f32_d64_k2_lse",
                "merge_states_f32_d64_k2",
                "merge_states_f32_d64_k16_lse",
                "merge_states_f32_d64_k16",
                "merge_states_f32_d64_kvar_lse",
                "merge_states_f32_d64_kvar",
                "merge_state_in_place_bf16_d64_mask_tm",
                "merge_state_in_place_bf16_d64_tm",
            ]
        );
        assert!(s.variants.iter().all(|v| !v.prefix_threshold));
        let e = err("[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\n");
        assert!(e.contains("missing the required key `num_states`"), "{e}");
        for bad in ["1", "17", "\"any\"", "2.0"] {
            let e = err(&format!(
                "[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\nnum_states = {bad}\n"
            ));
            assert!(
                e.contains("allowed: integers 2..=16, or \"runtime\""),
                "{e}"
            );
        }
        // Keys of another family are refused where they would be silently ignored.
        for (table, key) in [
            ("merge_states", "prefix_threshold = true"),
            ("merge_states", "rows_per_thread = 2"),
            ("merge_states", "lse_layout = \"head_major\""),
            ("merge_state_in_place", "output_lse = false"),
            ("merge_state_in_place", "output = \"fp8_e4m3\""),
            ("merge_attn_states", "num_states = 4"),
            ("merge_attn_states", "mask = true"),
        ] {
            let extra = if table == "merge_states" {
                "num_states = 4\n"
            } else {
                ""
            };
            let e = err(&format!(
                "[[{table}]]\ndtype = \"f32\"\nhead_size = 64\n{extra}{key}\n"
            ));
            let name = key.split(' ').next().unwrap();
            assert!(
                e.contains(&format!("`{name}` is not a key of [[{table}]]")),
                "{e}"
            );
        }
    }

    #[test]
    fn per_token_group_fp8_keys() {
        let s = parse(
            "t.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = [\"fp8_e4m3\", \"fp8_e4m3_group\"]\ngroup_size = [16, 128]\nue8m0 = [false, true]\n",
        )
        .unwrap();
        assert_eq!(
            s.kernel_names(),
            [
                "merge_attn_states_bf16_d128_thr_lse_fp8",
                "merge_attn_states_bf16_d128_thr_lse_fp8g16",
                "merge_attn_states_bf16_d128_thr_lse_fp8g16_ue8m0",
                "merge_attn_states_bf16_d128_thr_lse_fp8g128",
                "merge_attn_states_bf16_d128_thr_lse_fp8g128_ue8m0",
            ]
        );
        let base = "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\n";
        let e = err(&format!("{base}output = \"fp8_e4m3_group\"\n"));
        assert!(e.contains("needs `group_size`"), "{e}");
        let e = err(&format!("{base}group_size = 64\n"));
        assert!(
            e.contains("`group_size` applies only with output = \"fp8_e4m3_group\""),
            "{e}"
        );
        let e = err(&format!("{base}ue8m0 = true\n"));
        assert!(e.contains("`ue8m0` applies only with"), "{e}");
        let e = err(&format!(
            "{base}output = \"fp8_e4m3_group\"\ngroup_size = 48\n"
        ));
        assert!(
            e.contains("48 is not allowed; allowed: 16, 32, 64, 128"),
            "{e}"
        );
        // f32 d576 has 72 threads per row, two vectors each: a 64-element group (16 lanes) would
        // straddle them.
        let e = err(
            "[[merge_attn_states]]\ndtype = \"f32\"\nhead_size = 576\noutput = \"fp8_e4m3_group\"\ngroup_size = 64\n",
        );
        assert!(
            e.contains("`group_size` = 64 does not fit f32 d576")
                && e.contains("allowed here: 16, 32"),
            "{e}"
        );
        let e = err(
            "[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\nnum_states = 2\ngroup_size = 16\n",
        );
        assert!(
            e.contains("`group_size` is not a key of [[merge_states]]"),
            "{e}"
        );
    }

    #[test]
    fn expansion_is_capped() {
        let heads: Vec<String> = (1..=1024).map(|n| n.to_string()).collect();
        let text = format!(
            "[[merge_attn_states]]\ndtype = [\"f16\", \"bf16\", \"f32\"]\nhead_size = [{}]\nprefix_threshold = [true, false]\n",
            heads.join(", ")
        );
        assert!(err(&text).contains("more than 4096 kernels"));
    }

    #[test]
    fn every_tuned_entry_reaches_the_variants() {
        // A tuned table that fails to parse would silently fall back to the default schedule.
        let file: TunedFile = toml::from_str(TUNED_SCHEDULES).expect("specs/tuned.toml parses");
        assert!(!file.schedule.is_empty());
        let spec = default_spec().unwrap();
        for e in &file.schedule {
            let dtype = Dtype::from_name(&e.dtype).expect("known dtype");
            let want = Schedule {
                rows_per_thread: e.rows_per_thread,
                min_blocks_per_sm: e.min_blocks_per_sm,
                block_threads: e.block_threads,
                heads_per_block: e.heads_per_block,
            };
            assert_eq!(tuned_schedule(dtype, e.head_size), want);
            for v in spec
                .variants
                .iter()
                .filter(|v| v.dtype == dtype && v.head_size == e.head_size)
            {
                assert_eq!(v.schedule, want, "{}", v.kernel_name());
                assert!(!v.explicit_schedule);
            }
        }
    }

    #[test]
    fn arch_names_round_trip() {
        for a in ["sm_80", "sm_90a", "compute_90", "sm_120"] {
            assert_eq!(Arch::parse(a).unwrap().name(), a);
        }
        assert_eq!(Arch::parse("sm_90").unwrap().virtual_name(), "compute_90");
        assert_eq!(Arch::parse("compute_90").unwrap().real_name(), None);
    }
}
