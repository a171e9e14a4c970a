//! The spec's TOML as written: the raw tables, which keys belong to which table, and the
//! value parsers that report `file:line:column`. `super::parse` validates and expands them.

use serde::Deserialize;
use toml::Spanned;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSpec {
    pub(super) arch: Option<Spanned<toml::Value>>,
    /// Which targets carry PTX: "every" (default) or "newest".
    pub(super) ptx: Option<Spanned<toml::Value>>,
    /// Whether each kernel's `.cu` is written beside its images (default true).
    pub(super) sources: Option<Spanned<toml::Value>>,
    /// Whether the embedded default spec's kernels come too (default false).
    pub(super) include_default: Option<Spanned<toml::Value>>,
    pub(super) merge_attn_states: Option<Vec<Spanned<RawMerge>>>,
    pub(super) merge_states: Option<Vec<Spanned<RawMerge>>>,
    pub(super) merge_state_in_place: Option<Vec<Spanned<RawMerge>>>,
    pub(super) mask_empty_context_lse: Option<Vec<Spanned<RawMerge>>>,
}

impl RawSpec {
    /// Every table with the family it names, in the order of the families, each family's
    /// tables in the order written.
    pub(super) fn tables(self) -> Vec<(Family, Spanned<RawMerge>)> {
        [
            (PAIRWISE, self.merge_attn_states),
            (KWAY, self.merge_states),
            (IN_PLACE, self.merge_state_in_place),
            (MASK_LSE, self.mask_empty_context_lse),
        ]
        .into_iter()
        .flat_map(|(t, tables)| tables.unwrap_or_default().into_iter().map(move |f| (t, f)))
        .collect()
    }
}

/// The family of each table, standing for all of the table's kernels (whose K or mask its keys
/// decide): a table is compared with another by [`Family::table`].
const PAIRWISE: Family = Family::MergeAttnStates;
const KWAY: Family = Family::MergeStates { num_states: None };
const IN_PLACE: Family = Family::MergeStateInPlace { mask: false };
const MASK_LSE: Family = Family::MaskEmptyContextLse;

/// (key, its value, the tables it belongs to, why it is refused in the others)
pub(super) type KeyRule<'a> = (
    &'static str,
    &'a Option<Spanned<toml::Value>>,
    &'static [Family],
    &'static str,
);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMerge {
    pub(super) dtype: Option<Spanned<toml::Value>>,
    pub(super) head_size: Option<Spanned<toml::Value>>,
    pub(super) prefix_threshold: Option<Spanned<toml::Value>>,
    pub(super) output_lse: Option<Spanned<toml::Value>>,
    pub(super) output: Option<Spanned<toml::Value>>,
    pub(super) lse_layout: Option<Spanned<toml::Value>>,
    /// The lse's base: "e" (vLLM's, FlashAttention's) or "2" (FlashInfer's).
    pub(super) lse_base: Option<Spanned<toml::Value>>,
    pub(super) rows_per_thread: Option<Spanned<toml::Value>>,
    pub(super) min_blocks_per_sm: Option<Spanned<toml::Value>>,
    pub(super) block_threads: Option<Spanned<toml::Value>>,
    pub(super) heads_per_block: Option<Spanned<toml::Value>>,
    /// Vectors of a row per thread (1, 2, 4); absent: the fewest that fit 128 threads a row.
    pub(super) vecs_per_thread: Option<Spanned<toml::Value>>,
    /// merge_states only: K values (integers 1..=16) and/or "runtime".
    pub(super) num_states: Option<Spanned<toml::Value>>,
    /// merge_state_in_place only: a per-token mask argument.
    pub(super) mask: Option<Spanned<toml::Value>>,
    /// output = "fp8_e4m3_group" only: elements per scale (16, 32, 64, 128).
    pub(super) group_size: Option<Spanned<toml::Value>>,
    /// output = "fp8_e4m3_group" only: scales rounded up to powers of two.
    pub(super) ue8m0: Option<Spanned<toml::Value>>,
    /// merge_attn_states only: the empty-context lse mask fused into the merge.
    pub(super) mask_empty_context: Option<Spanned<toml::Value>>,
    /// Every table: programmatic dependent launch (needs an sm_90+ target).
    pub(super) pdl: Option<Spanned<toml::Value>>,
    /// merge_attn_states only: build the tuned size rule's kernels (default true).
    pub(super) size_rule: Option<Spanned<toml::Value>>,
    /// merge_attn_states only: build each kernel's dense specialization (default true).
    pub(super) dense: Option<Spanned<toml::Value>>,
}

impl RawMerge {
    /// Keys that mean nothing in `table`, with why, so a spec cannot set an option that would be
    /// silently ignored.
    pub(super) fn foreign_keys(
        &self,
        table: Family,
    ) -> Option<(&'static str, &Spanned<toml::Value>, &'static str)> {
        // (key, its value, the tables it belongs to, why elsewhere it is refused)
        const MERGES: &[Family] = &[PAIRWISE, KWAY, IN_PLACE];
        let keys: [KeyRule; 19] = [
            (
                "group_size",
                &self.group_size,
                &[PAIRWISE],
                "per-token-group FP8 belongs to [[merge_attn_states]] with output = \"fp8_e4m3_group\"",
            ),
            (
                "ue8m0",
                &self.ue8m0,
                &[PAIRWISE],
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
                "vecs_per_thread",
                &self.vecs_per_thread,
                &[PAIRWISE],
                "vectors per thread are tuned for the pairwise merge only",
            ),
            (
                "num_states",
                &self.num_states,
                &[KWAY],
                "K belongs to [[merge_states]]",
            ),
            (
                "mask",
                &self.mask,
                &[IN_PLACE],
                "a mask belongs to [[merge_state_in_place]]",
            ),
            (
                "mask_empty_context",
                &self.mask_empty_context,
                &[PAIRWISE],
                "the fused empty-context mask belongs to [[merge_attn_states]] (a separate [[mask_empty_context_lse]] serves the others)",
            ),
            (
                "size_rule",
                &self.size_rule,
                &[PAIRWISE],
                "size rules are tuned for the pairwise merge only",
            ),
            (
                "dense",
                &self.dense,
                &[PAIRWISE],
                "dense specializations exist for the pairwise merge only",
            ),
            (
                "prefix_threshold",
                &self.prefix_threshold,
                &[PAIRWISE],
                "only the pairwise merge has a threshold (an in-place merge can use `mask`)",
            ),
            (
                "output",
                &self.output,
                &[PAIRWISE],
                "only the pairwise merge has output kinds; this one writes its input dtype",
            ),
            (
                "lse_layout",
                &self.lse_layout,
                &[PAIRWISE, IN_PLACE, MASK_LSE],
                "merge_states' lse is [T, K, H] in and [T, H] out",
            ),
            (
                "lse_base",
                &self.lse_base,
                MERGES,
                "the lse mask writes -inf, which is the same in every base",
            ),
            (
                "output_lse",
                &self.output_lse,
                &[PAIRWISE, KWAY],
                "only the pairwise and K-way merges write a separate output lse",
            ),
            (
                "rows_per_thread",
                &self.rows_per_thread,
                MERGES,
                "the lse mask has a fixed launch shape",
            ),
        ];
        keys.into_iter().find_map(|(key, value, home, why)| {
            value
                .as_ref()
                .filter(|_| !home.iter().any(|h| h.table() == table.table()))
                .map(|v| (key, v, why))
        })
    }
}

pub(super) struct Ctx<'a> {
    pub(super) origin: &'a str,
    pub(super) text: &'a str,
}

impl Ctx<'_> {
    pub(super) fn at(&self, offset: usize, message: String) -> SpecError {
        let (line, column) = line_col(self.text, offset);
        SpecError::At {
            origin: self.origin.to_string(),
            line,
            column,
            message,
        }
    }

    pub(super) fn required<'v>(
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
    pub(super) fn schedule_choices(
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
    pub(super) fn list<T: PartialEq>(
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

pub(super) fn short(v: &toml::Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
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

pub(super) fn one_of<T: Copy>(
    key_values: &[(&'static str, T)],
    v: &toml::Value,
) -> Result<T, String> {
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

pub(super) fn boolean(v: &toml::Value) -> Result<bool, String> {
    v.as_bool()
        .ok_or_else(|| format!("expected true or false, got {}", short(v)))
}

pub(super) fn head_size(v: &toml::Value) -> Result<u32, String> {
    match v.as_integer() {
        Some(n) if (1..=i64::from(MAX_HEAD_SIZE)).contains(&n) => Ok(n as u32),
        Some(n) => Err(format!("{n} is out of range; allowed: 1..={MAX_HEAD_SIZE}")),
        None => Err(format!(
            "expected an integer in 1..={MAX_HEAD_SIZE}, got {}",
            short(v)
        )),
    }
}

pub(super) fn dtype(v: &toml::Value) -> Result<Dtype, String> {
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
pub(super) fn num_states(v: &toml::Value) -> Result<Option<u32>, String> {
    let allowed = format!("integers 1..={MAX_NUM_STATES}, or \"runtime\"");
    match v {
        toml::Value::Integer(n) if (1..=i64::from(MAX_NUM_STATES)).contains(n) => {
            Ok(Some(*n as u32))
        }
        toml::Value::String(s) if s == "runtime" => Ok(None),
        _ => Err(format!("{} is not allowed; allowed: {allowed}", short(v))),
    }
}

pub(super) fn arch(v: &toml::Value) -> Result<Arch, String> {
    match v.as_str() {
        Some(s) => Arch::parse(s),
        None => Err(format!(
            "expected a string such as \"sm_90\", got {}",
            short(v)
        )),
    }
}
