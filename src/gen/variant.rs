//! A kernel variant: every choice of one kernel fixed (family, dtype, head size, options,
//! schedule). The spec expands into these; the ABI, render and compile stages read them. The
//! option types hosts read back from the manifest are in [`crate::variant`].

use serde::{Deserialize, Serialize};

use crate::dtype::Dtype;
pub use crate::variant::{
    Arch, Family, Fp8Group, LseLayout, OutputKind, Schedule, SizeRange, MIN_ARCH,
};
pub use twin::{decision_list, Role, Twin, TwinKind, TwinSet, TWIN_KINDS};

mod twin;

pub const GROUP_SIZES_ALLOWED: [u32; 4] = [16, 32, 64, 128];

pub use crate::reference::LseBase;

pub const ROWS_PER_THREAD_ALLOWED: [u32; 4] = [1, 2, 4, 8];
pub const BLOCK_THREADS_ALLOWED: [u32; 4] = [128, 256, 512, 1024];
pub const HEADS_PER_BLOCK_ALLOWED: [u32; 6] = [1, 2, 4, 8, 16, 32];
pub const VECS_PER_THREAD_ALLOWED: [u32; 3] = [1, 2, 4];
pub const MAX_THREADS_PER_SM: u32 = 2048;

/// Used where the tuned table has no entry for a (dtype, head size).
pub const FALLBACK_SCHEDULE: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 256,
    heads_per_block: 1,
    vecs_per_thread: 0,
};

/// The K-way merge's schedule where the spec sets none: 128-thread blocks of eight adjacent heads.
/// Tuning over specs/kway-candidates.toml found 128-thread blocks best, and over
/// specs/kway-candidates-2.toml 8 heads per block faster than 2 at K = 4 and 8, bf16 D = 128 on
/// the H200 (docs/PERFORMANCE.md): each state's rows of adjacent heads are adjacent in memory. One row per thread, since the K rows of a token are already the loads in
/// flight.
pub const KWAY_SCHEDULE: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 128,
    heads_per_block: 8,
    vecs_per_thread: 0,
};

/// The in-place merge's schedule for token-major lse where the spec sets none: the K-way
/// merge's 128-thread blocks of eight adjacent heads. With the pairwise merge's tuned schedules
/// (512-thread blocks of 1-2 heads at d64/d128, tuned for head-major lse) it ran at 0.87-0.93x
/// FlashInfer's MergeStateInPlace at 32 heads, bandwidth-bound sizes included: a block's lse
/// reads were one float in every H, and its 512 threads left most SMs idle below 2K tokens
/// (0.73-0.82x hot at 256 tokens); at d256, 8 heads per block, it matched FlashInfer
/// (0.99-1.00x above 100 MB; docs/perf/kway-2026-12-04.json).
pub const TOKEN_MAJOR_IN_PLACE_SCHEDULE: Schedule = Schedule {
    block_threads: 128,
    heads_per_block: 8,
    ..KWAY_SCHEDULE
};

/// The lse mask's launch (not a spec key): 256 threads, one token each, and every thread masks
/// 16 heads of its token after one binary search over the request starts, instead of one search
/// per (token, head), which was slower than a PyTorch composite at 32768 x 128
/// (docs/PERFORMANCE.md).
pub const MASK_SCHEDULE: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 256,
    heads_per_block: 16,
    vecs_per_thread: 0,
};

/// Schedules measured best by `mla-gen tune`, checked in so generation needs no GPU.
pub const TUNED_SCHEDULES: &str = include_str!("../../specs/tuned.toml");

#[derive(Deserialize)]
pub(crate) struct TunedFile {
    #[serde(default)]
    pub(crate) schedule: Vec<TunedEntry>,
    #[serde(default)]
    pub(crate) size_rule: Vec<TunedRule>,
}

/// A size rule of the tuned table: the pairwise merge's schedules by launch size.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TunedRule {
    pub(crate) dtype: String,
    pub(crate) head_size: u32,
    /// Ascending bounds; the last range has none (it serves every larger launch).
    pub(crate) ranges: Vec<TunedRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TunedRange {
    pub(crate) below_rows: Option<u64>,
    #[serde(default = "one")]
    pub(crate) rows_per_thread: u32,
    #[serde(default = "one")]
    pub(crate) min_blocks_per_sm: u32,
    pub(crate) block_threads: u32,
    #[serde(default = "one")]
    pub(crate) heads_per_block: u32,
    #[serde(default)]
    pub(crate) vecs_per_thread: u32,
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
    #[serde(default)]
    pub(crate) vecs_per_thread: u32,
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
            vecs_per_thread: e.vecs_per_thread,
        })
}

/// The tuned size rule of the pairwise merge (output = input dtype, no fused mask) for a
/// (dtype, head size): the schedule of the largest launches, and the smaller launches' ranges.
/// `mla-gen tune --l2 both` measures such merges only, so the rule applies to no other kernel.
pub fn tuned_size_rule(dtype: Dtype, head_size: u32) -> Option<(Schedule, Vec<SizeRange>)> {
    static TABLE: std::sync::OnceLock<Vec<TunedRule>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        toml::from_str::<TunedFile>(TUNED_SCHEDULES)
            .map(|f| f.size_rule)
            .unwrap_or_default()
    });
    let rule = table
        .iter()
        .find(|e| e.dtype == dtype.name() && e.head_size == head_size)?;
    let schedule = |r: &TunedRange| Schedule {
        rows_per_thread: r.rows_per_thread,
        min_blocks_per_sm: r.min_blocks_per_sm,
        block_threads: r.block_threads,
        heads_per_block: r.heads_per_block,
        vecs_per_thread: r.vecs_per_thread,
    };
    let (last, smaller) = rule.ranges.split_last()?;
    let ranges = smaller
        .iter()
        .map(|r| SizeRange {
            below_rows: r.below_rows.unwrap_or(0),
            schedule: schedule(r),
        })
        .collect();
    Some((schedule(last), ranges))
}

/// The default schedule of a merge with the fused empty-context mask: its blocks wait at a barrier
/// for their tokens' flags, so they are at most 256 threads (a shorter wait per block), and unless
/// the spec says otherwise 16-bit ones ask ptxas for full occupancy (spec.rs), which the search's
/// registers would otherwise cost (40 registers: 6 blocks of 256). At 1K-32K tokens x 16 heads,
/// bf16 D = 128 and 512, 256 threads with 8 blocks per SM beat 128 and 512 (docs/PERFORMANCE.md).
pub fn fused_mask_schedule(tuned: Schedule) -> Schedule {
    Schedule {
        block_threads: tuned.block_threads.min(256),
        ..tuned
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
    /// Absent from the manifest in base e.
    #[serde(default, skip_serializing_if = "LseBase::is_e")]
    pub lse_base: LseBase,
    pub schedule: Schedule,
    /// The spec chose the schedule (it then shows in the name); else it is the tuned one.
    pub explicit_schedule: bool,
    /// Pairwise merge only: also take the requests' query and context start locations and read
    /// `prefix_lse` as -inf for every token of a request with an empty context (the
    /// `mask_empty_context_lse` kernel fused in; docs/SEMANTICS.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mask_empty_context: bool,
    /// Programmatic dependent launch (sm_90+): the kernel waits (`griddepcontrol.wait`) for the
    /// previous kernel on its stream before touching memory, so hosts may launch it with
    /// programmatic stream serialization (docs/SEMANTICS.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pdl: bool,
    /// The kernel of a size rule that launches take: the schedules of smaller launches, by
    /// ascending bound, each built as its own kernel (`rows_below`); `schedule` serves the rest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub size_rule: Vec<SizeRange>,
    /// A range kernel, a specialization, or a kernel callers name, and the twins it offers
    /// ([`TWIN_KINDS`] describes each kind); the manifest writes it as `rows_below` and one key per
    /// kind.
    #[serde(flatten)]
    pub role: Role,
}

impl MergeVariant {
    /// A `[[merge_attn_states]]` kernel with the spec's defaults (the threshold, an output lse,
    /// output = input dtype, head-major lse, no fused mask, no pdl) and the fallback schedule:
    /// the starting point of a variant built in code, changed with `..` field updates.
    pub fn merge_attn_states(dtype: Dtype, head_size: u32) -> MergeVariant {
        MergeVariant {
            family: Family::MergeAttnStates,
            dtype,
            head_size,
            prefix_threshold: true,
            output_lse: true,
            output: OutputKind::Same,
            fp8_group: None,
            lse_layout: LseLayout::HeadMajor,
            lse_base: LseBase::E,
            schedule: FALLBACK_SCHEDULE,
            explicit_schedule: false,
            mask_empty_context: false,
            pdl: false,
            size_rule: Vec::new(),
            role: Role::default(),
        }
    }

    /// The kernel of `range` in this variant's size rule: the same variant with the range's
    /// schedule, named after this one with `_below<rows>`.
    pub fn range_kernel(&self, range: &SizeRange) -> MergeVariant {
        MergeVariant {
            schedule: range.schedule,
            size_rule: Vec::new(),
            // Its twins follow its own schedule: the spec layer offers them.
            role: Role {
                rows_below: Some(range.below_rows),
                ..Role::default()
            },
            ..self.clone()
        }
    }

    /// This variant and the kernels of its tuned size rule, where one applies: a pairwise merge
    /// writing its input dtype, without the fused mask or a schedule of the spec's (what
    /// `mla-gen tune` times). The variant takes the rule's schedule for the largest launches.
    pub fn with_tuned_size_rule(mut self) -> Vec<MergeVariant> {
        let applies = self.family == Family::MergeAttnStates
            && self.output == OutputKind::Same
            && !self.mask_empty_context
            && !self.explicit_schedule;
        let Some((largest, ranges)) = applies
            .then(|| tuned_size_rule(self.dtype, self.head_size))
            .flatten()
        else {
            return vec![self];
        };
        self.schedule = largest;
        self.size_rule = ranges;
        let kernels = self.size_rule.iter().map(|r| self.range_kernel(r));
        std::iter::once(self.clone()).chain(kernels).collect()
    }

    /// The specializations of this kernel, in the order hosts try them ([`Role::twin_sets`]).
    /// The general kernel's size rule has already chosen this kernel when a host looks at its
    /// specializations: the twins have no size rule, and offer no twins, of their own.
    pub fn specialization_twins(&self) -> Vec<MergeVariant> {
        let twin = |twin_of| MergeVariant {
            size_rule: Vec::new(),
            role: Role {
                rows_below: self.role.rows_below,
                twin_of,
                twins: TwinSet::EMPTY,
            },
            ..self.clone()
        };
        self.role.twin_sets().into_iter().map(twin).collect()
    }

    /// These kernels, each followed by its specializations.
    pub fn with_twins(kernels: Vec<MergeVariant>) -> Vec<MergeVariant> {
        kernels
            .into_iter()
            .flat_map(|k| {
                let twins = k.specialization_twins();
                std::iter::once(k).chain(twins)
            })
            .collect()
    }

    /// Readable and stable: family, dtype, head size, then one tag per non-default option, in
    /// this order (the role's tags, `_below<rows>` and the twins', before `_pdl`).
    pub fn kernel_name(&self) -> String {
        let tag = |on: bool, tag: &str| if on { tag.to_string() } else { String::new() };
        let token_major = self.lse_layout == LseLayout::TokenMajor;
        let family = match self.family {
            Family::MergeAttnStates => String::new(),
            Family::MergeStates { num_states } => {
                num_states.map_or("_kvar".into(), |k| format!("_k{k}"))
            }
            Family::MergeStateInPlace { mask } => tag(mask, "_mask"),
            // It has no dtype or head size: the name is the family and its lse layout.
            Family::MaskEmptyContextLse => {
                return [
                    self.family.table(),
                    &tag(token_major, "_tm"),
                    &tag(self.pdl, "_pdl"),
                ]
                .concat()
            }
        };
        let in_place = matches!(self.family, Family::MergeStateInPlace { .. });
        let k_way = matches!(self.family, Family::MergeStates { .. });
        let group = self
            .fp8_group
            .map(|g| format!("_fp8g{}{}", g.group_size, tag(g.ue8m0, "_ue8m0")));
        let s = &self.schedule;
        let schedule = self.explicit_schedule.then(|| {
            let vecs = tag(s.vecs_per_thread > 0, &format!("v{}", s.vecs_per_thread));
            let (r, m, b, h) = (
                s.rows_per_thread,
                s.min_blocks_per_sm,
                s.block_threads,
                s.heads_per_block,
            );
            format!("_r{r}m{m}b{b}h{h}{vecs}")
        });
        [
            format!(
                "{}_{}_d{}",
                self.family.table(),
                self.dtype.name(),
                self.head_size
            ),
            family,
            tag(self.prefix_threshold, "_thr"),
            // The in-place merge always updates its state's lse: no tag.
            tag(self.output_lse && !in_place, "_lse"),
            // merge_states has one lse layout ([T, K, H] in, [T, H] out): no tag.
            tag(token_major && !k_way, "_tm"),
            tag(self.lse_base == LseBase::Two, "_base2"),
            tag(self.mask_empty_context, "_ctxmask"),
            tag(self.output == OutputKind::Fp8E4m3, "_fp8"),
            group.unwrap_or_default(),
            schedule.unwrap_or_default(),
            self.role.name_suffix(),
            tag(self.pdl, "_pdl"),
        ]
        .concat()
    }
}
