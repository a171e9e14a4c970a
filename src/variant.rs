//! What a kernel was generated with, as every host reads it from the manifest: its family,
//! output kind, lse layout, FP8 grouping, schedule and target architectures. Shared by the
//! generator (`gen::variant` builds kernels from them) and the runtime (which reads
//! them back); serde only.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;

/// Oldest compute capability the templates support (bf16 conversions need sm_80).
pub const MIN_ARCH: u32 = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OutputKind {
    /// Output dtype = input dtype.
    Same,
    /// FP8 e4m3 with one float32 scale for the whole tensor, read from a device pointer:
    /// out = saturate(value / scale), round to nearest even.
    Fp8E4m3,
    /// FP8 e4m3 with one float32 scale per group of `group_size` elements of a row, computed by
    /// the kernel (max(absmax, 1e-10) x RN(1/448), optionally rounded up to a power of two) and written
    /// through caller-given token and group strides. Its parameters: [`Fp8Group`].
    Fp8E4m3Group,
}

impl OutputKind {
    #[cfg_attr(not(feature = "codegen"), allow(dead_code))]
    pub(crate) const ALL: [(&'static str, OutputKind); 3] = [
        ("same", OutputKind::Same),
        ("fp8_e4m3", OutputKind::Fp8E4m3),
        ("fp8_e4m3_group", OutputKind::Fp8E4m3Group),
    ];
    pub fn name(self) -> &'static str {
        match self {
            OutputKind::Same => "same",
            OutputKind::Fp8E4m3 => "fp8_e4m3",
            OutputKind::Fp8E4m3Group => "fp8_e4m3_group",
        }
    }
    /// The output element type for inputs of `input`.
    pub fn dtype(self, input: Dtype) -> Dtype {
        match self {
            OutputKind::Same => input,
            OutputKind::Fp8E4m3 | OutputKind::Fp8E4m3Group => Dtype::Fp8E4m3,
        }
    }
}

/// Per-token-group FP8 output: the group size and whether scales are powers of two (UE8M0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Fp8Group {
    pub group_size: u32,
    pub ue8m0: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LseLayout {
    /// `[H, T]`: element (h, t) at `h * T + t` (vLLM's layout).
    HeadMajor,
    /// `[T, H]`: element (h, t) at `t * H + h`.
    TokenMajor,
}

impl LseLayout {
    #[cfg_attr(not(feature = "codegen"), allow(dead_code))]
    pub(crate) const ALL: [(&'static str, LseLayout); 2] = [
        ("head_major", LseLayout::HeadMajor),
        ("token_major", LseLayout::TokenMajor),
    ];
    pub fn name(self) -> &'static str {
        match self {
            LseLayout::HeadMajor => "head_major",
            LseLayout::TokenMajor => "token_major",
        }
    }
}

/// A GPU target: `sm_XY` (PTX for compute_XY + CUBIN for sm_XY) or `compute_XY` (PTX only).
/// An `a` suffix (sm_90a) selects the architecture-specific feature set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[non_exhaustive]
pub struct Arch {
    pub major_minor: u32,
    pub arch_specific: bool,
    pub real: bool,
}

impl Arch {
    pub fn parse(s: &str) -> Result<Arch, String> {
        let (real, rest) = if let Some(r) = s.strip_prefix("sm_") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("compute_") {
            (false, r)
        } else {
            return Err(format!(
                "`{s}` is not an architecture: write sm_XY (PTX + CUBIN) or compute_XY (PTX only), e.g. sm_90"
            ));
        };
        let (digits, arch_specific) = match rest.strip_suffix('a') {
            Some(d) => (d, true),
            None => (rest, false),
        };
        let number: u32 = match digits.parse() {
            Ok(n) if !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()) => n,
            _ => {
                return Err(format!(
                    "`{s}` is not an architecture: the number after `sm_`/`compute_` must be digits, e.g. sm_90"
                ))
            }
        };
        if number < MIN_ARCH {
            return Err(format!(
                "`{s}` is older than sm_{MIN_ARCH}, the oldest target the templates support (bf16 conversions need sm_80)"
            ));
        }
        Ok(Arch {
            major_minor: number,
            arch_specific,
            real,
        })
    }
    fn suffix(&self) -> &'static str {
        if self.arch_specific {
            "a"
        } else {
            ""
        }
    }
    /// `sm_90` / `compute_90`: as the user wrote it.
    pub fn name(&self) -> String {
        let prefix = if self.real { "sm" } else { "compute" };
        format!("{prefix}_{}{}", self.major_minor, self.suffix())
    }
    /// The virtual architecture its PTX is generated for.
    pub fn virtual_name(&self) -> String {
        format!("compute_{}{}", self.major_minor, self.suffix())
    }
    /// The real architecture of its CUBIN, if any.
    pub fn real_name(&self) -> Option<String> {
        self.real
            .then(|| format!("sm_{}{}", self.major_minor, self.suffix()))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// How a kernel's threads walk its rows: a performance choice that never changes results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Schedule {
    /// Rows each thread handles, all their loads issued before the first is used (1, 2, 4, 8).
    pub rows_per_thread: u32,
    /// `__launch_bounds__` minimum blocks per SM: caps registers so that many blocks fit.
    pub min_blocks_per_sm: u32,
    /// Target threads per block; the block is the nearest whole number of rows (and of warps,
    /// where the row width allows) at or under it.
    pub block_threads: u32,
    /// Adjacent heads of the same tokens a block covers (1, 2, 4, 8): their rows are adjacent
    /// in memory, so cache lines shared between two heads' rows are used while they are in L2.
    pub heads_per_block: u32,
    /// Vectors of a row each thread moves (1, 2, 4): more amortize the row's lse, weights and
    /// addressing over more bytes, fewer spread a row over more threads. 0 (absent): the fewest
    /// that keep a row within 128 threads.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub vecs_per_thread: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One range of a size rule (docs/MANIFEST.md, "Size rules"): launches whose rows
/// (tokens x heads) are below `below_rows`, and not below the previous range's bound, run the
/// kernel built with `schedule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SizeRange {
    pub below_rows: u64,
    pub schedule: Schedule,
}

/// Which merge a kernel performs (docs/SEMANTICS.md has each one's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Family {
    /// `output = merge(prefix, suffix)`, with the prefix-token threshold (vLLM's kernel).
    MergeAttnStates,
    /// K states `[T, K, H, D]` with lse `[T, K, H]` merged in one pass into `[T, H, D]`.
    MergeStates {
        /// K fixed at compile time; `None`: K is the launch argument `num_states`.
        num_states: Option<u32>,
    },
    /// `state := merge(state, other)` in place; with `mask`, tokens whose mask byte is 0 are
    /// left untouched.
    MergeStateInPlace { mask: bool },
    /// lse := -inf for every head of the tokens of requests whose context is empty (given query
    /// and context start locations per request), before a merge.
    MaskEmptyContextLse,
}

impl Family {
    /// The spec table (and kernel-name prefix) of the family.
    pub fn table(self) -> &'static str {
        match self {
            Family::MergeAttnStates => "merge_attn_states",
            Family::MergeStates { .. } => "merge_states",
            Family::MergeStateInPlace { .. } => "merge_state_in_place",
            Family::MaskEmptyContextLse => "mask_empty_context_lse",
        }
    }
}
