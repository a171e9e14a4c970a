//! A kernel variant: every choice of one kernel fixed (family, dtype, head size, options,
//! schedule). The spec expands into these; the ABI, render and compile stages read them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;

/// Oldest compute capability the templates support (bf16 conversions need sm_80).
pub const MIN_ARCH: u32 = 80;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// Output dtype = input dtype.
    Same,
    /// FP8 e4m3 with one float32 scale for the whole tensor, read from a device pointer:
    /// out = saturate(value / scale), round to nearest even.
    Fp8E4m3,
    /// FP8 e4m3 with one float32 scale per group of `group_size` elements of a row, computed by
    /// the kernel (max(absmax, 1e-10) / 448, optionally rounded up to a power of two) and written
    /// through caller-given token and group strides. Its parameters: [`Fp8Group`].
    Fp8E4m3Group,
}

impl OutputKind {
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

pub const GROUP_SIZES_ALLOWED: [u32; 4] = [16, 32, 64, 128];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LseLayout {
    /// `[H, T]`: element (h, t) at `h * T + t` (vLLM's layout).
    HeadMajor,
    /// `[T, H]`: element (h, t) at `t * H + h`.
    TokenMajor,
}

impl LseLayout {
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
}

pub const ROWS_PER_THREAD_ALLOWED: [u32; 4] = [1, 2, 4, 8];
pub const BLOCK_THREADS_ALLOWED: [u32; 4] = [128, 256, 512, 1024];
pub const HEADS_PER_BLOCK_ALLOWED: [u32; 4] = [1, 2, 4, 8];
pub const MAX_THREADS_PER_SM: u32 = 2048;

/// Used where the tuned table has no entry for a (dtype, head size).
pub const FALLBACK_SCHEDULE: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 256,
    heads_per_block: 1,
};

/// The K-way merge's schedule where the spec sets none: 128-thread blocks of eight adjacent heads.
/// Round 1 (specs/kway-candidates.toml, 48 candidates) found 128-thread blocks best; round 2
/// (specs/kway-candidates-2.toml) found 8 heads per block 2-12% faster than 2 at K = 4 and 8,
/// bf16 D = 128 on the H200 (docs/PERFORMANCE.md): each state's rows of adjacent heads are
/// adjacent in memory. One row per thread, since the K rows of a token are already the loads in
/// flight.
pub const KWAY_SCHEDULE: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 128,
    heads_per_block: 8,
};

/// The lse mask's launch (not a spec key): 256 threads, one token each, and every thread masks
/// 16 heads of its token after one binary search over the request starts, instead of one search
/// per (token, head) (run 14: that was slower than a PyTorch composite at 32768 x 128).
pub const MASK_SCHEDULE: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 256,
    heads_per_block: 16,
};

/// Schedules measured best by `mla-gen tune`, checked in so generation needs no GPU.
pub const TUNED_SCHEDULES: &str = include_str!("../../specs/tuned.toml");

#[derive(Deserialize)]
pub(crate) struct TunedFile {
    #[serde(default)]
    pub(crate) schedule: Vec<TunedEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TunedEntry {
    pub(crate) dtype: String,
    pub(crate) head_size: u32,
    pub(crate) rows_per_thread: u32,
    pub(crate) min_blocks_per_sm: u32,
    pub(crate) block_threads: u32,
    #[serde(default = "one")]
    pub(crate) heads_per_block: u32,
}

fn one() -> u32 {
    1
}

/// The tuned schedule for a (dtype, head size), or the fallback.
pub fn tuned_schedule(dtype: Dtype, head_size: u32) -> Schedule {
    static TABLE: std::sync::OnceLock<Vec<TunedEntry>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        toml::from_str::<TunedFile>(TUNED_SCHEDULES)
            .map(|f| f.schedule)
            .unwrap_or_default()
    });
    table
        .iter()
        .find(|e| e.dtype == dtype.name() && e.head_size == head_size)
        .map_or(FALLBACK_SCHEDULE, |e| Schedule {
            rows_per_thread: e.rows_per_thread,
            min_blocks_per_sm: e.min_blocks_per_sm,
            block_threads: e.block_threads,
            heads_per_block: e.heads_per_block,
        })
}

/// Which merge a kernel performs (docs/SEMANTICS.md has each one's rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
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

/// Compile-time K of `[[merge_states]]`: enough for split-KV decode; more goes to the runtime-K
/// variant, which loops.
pub const MAX_NUM_STATES: u32 = 16;

/// One kernel to generate: every choice fixed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MergeVariant {
    pub family: Family,
    pub dtype: Dtype,
    pub head_size: u32,
    pub prefix_threshold: bool,
    pub output_lse: bool,
    pub output: OutputKind,
    /// With `output = fp8_e4m3_group`: its group size and scale rounding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp8_group: Option<Fp8Group>,
    pub lse_layout: LseLayout,
    pub schedule: Schedule,
    /// The spec chose the schedule (it then shows in the name); else it is the tuned one.
    pub explicit_schedule: bool,
    /// Pairwise merge only: also take the requests' query and context start locations and read
    /// `prefix_lse` as -inf for every token of a request with an empty context (the
    /// `mask_empty_context_lse` kernel fused in; docs/SEMANTICS.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mask_empty_context: bool,
}

impl MergeVariant {
    /// Readable and stable: family, dtype, head size, then one tag per non-default option.
    pub fn kernel_name(&self) -> String {
        let mut name = format!(
            "{}_{}_d{}",
            self.family.table(),
            self.dtype.name(),
            self.head_size
        );
        match self.family {
            Family::MergeAttnStates => {}
            Family::MergeStates {
                num_states: Some(k),
            } => name.push_str(&format!("_k{k}")),
            Family::MergeStates { num_states: None } => name.push_str("_kvar"),
            Family::MergeStateInPlace { mask } => {
                if mask {
                    name.push_str("_mask");
                }
            }
            // It has no dtype or head size: the name is the family and its lse layout.
            Family::MaskEmptyContextLse => {
                let mut name = self.family.table().to_string();
                if self.lse_layout == LseLayout::TokenMajor {
                    name.push_str("_tm");
                }
                return name;
            }
        }
        if self.prefix_threshold {
            name.push_str("_thr");
        }
        // The in-place merge always updates its state's lse: no tag.
        if self.output_lse && !matches!(self.family, Family::MergeStateInPlace { .. }) {
            name.push_str("_lse");
        }
        // merge_states has one lse layout ([T, K, H] in, [T, H] out): no tag.
        if self.lse_layout == LseLayout::TokenMajor
            && !matches!(self.family, Family::MergeStates { .. })
        {
            name.push_str("_tm");
        }
        if self.mask_empty_context {
            name.push_str("_ctxmask");
        }
        if self.output == OutputKind::Fp8E4m3 {
            name.push_str("_fp8");
        }
        if let Some(g) = self.fp8_group {
            name.push_str(&format!("_fp8g{}", g.group_size));
            if g.ue8m0 {
                name.push_str("_ue8m0");
            }
        }
        if self.explicit_schedule {
            let s = &self.schedule;
            name.push_str(&format!(
                "_r{}m{}b{}h{}",
                s.rows_per_thread, s.min_blocks_per_sm, s.block_threads, s.heads_per_block
            ));
        }
        name
    }
}
