//! How a variant's threads map onto rows: vector width, threads per row, tokens and heads per
//! block, and the grid rule that follows. `abi` puts the launch rule into the contract; the
//! templates read the rest.

use serde::Serialize;

use crate::contract::{GridAxis, SizeRule, SizeRuleRange};
use crate::gen::variant::{Family, MergeVariant, Twin};

/// Widest access per thread: 16 bytes (one `ld.global.v4.b32`).
pub const MAX_VEC_BYTES: u32 = 16;
/// Threads that cooperate on one row stop growing here; longer rows loop.
pub const MAX_THREADS_PER_ROW: u32 = 128;
/// CUDA's limit on gridDim.y, which counts heads: launchers refuse more heads.
pub const MAX_GRID_Y: u32 = 65535;

/// How a variant's threads map onto rows, and the launch rule that follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Launch {
    /// Elements per vector access.
    pub vec_elems: u32,
    /// Bytes per vector access: pointers must be aligned to it, strides multiples of `vec_elems`.
    pub vec_bytes: u32,
    /// 32-bit words per vector access (0 for a 2-byte access).
    pub vec_words: u32,
    /// Bytes per output vector access (vec_elems output elements): the output pointer's
    /// alignment. Equals vec_bytes unless the output type differs (fp8).
    pub out_vec_bytes: u32,
    /// 32-bit words per output vector access (0 below 4 bytes).
    pub out_vec_words: u32,
    pub vecs_per_row: u32,
    pub threads_per_row: u32,
    pub vecs_per_thread: u32,
    pub tokens_per_block: u32,
    pub block_threads: u32,
    /// Adjacent heads a block covers (grid.y counts groups of them).
    pub heads_per_block: u32,
    /// Rows each thread handles, all loads issued before any is used.
    pub rows_per_thread: u32,
    /// `__launch_bounds__` occupancy hint.
    pub min_blocks_per_sm: u32,
    pub shared_mem_bytes: u32,
    /// Human-readable grid rule; `grid()` computes it.
    pub grid_rule: &'static str,
    /// The grid rule as data: `ceil(dim / per_block)` per axis.
    pub grid_x: GridAxis,
    pub grid_y: GridAxis,
    /// Rows `t * H + h` in order, `tokens_per_block * heads_per_block` per block: the grid
    /// (ceil(num_tokens / that), num_heads) is read as one line of blocks in launch order, each
    /// holding the next rows whatever the head count (the `_flat` specializations; absent:
    /// false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flat_rows: bool,
    /// Launch with programmatic stream serialization on devices of compute capability 9.0 and
    /// newer (the kernel waits for the previous one itself); absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pdl: bool,
    /// Launches with fewer rows run other kernels (docs/MANIFEST.md, "Size rules"); absent:
    /// every launch runs this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_rule: Option<SizeRule>,
    /// Kernels to launch instead, the first whose contract accepts the call (docs/MANIFEST.md,
    /// "Specializations"); absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub specializations: Vec<String>,
}

/// The size rule of `v` (the main kernel of one), with its ranges' kernel names.
fn size_rule_of(v: &MergeVariant, grid_x: &GridAxis, grid_y: &GridAxis) -> Option<SizeRule> {
    if v.size_rule.is_empty() {
        return None;
    }
    let ranges = v
        .size_rule
        .iter()
        .map(|r| SizeRuleRange {
            below_rows: r.below_rows,
            kernel: v.range_kernel(r).kernel_name(),
        })
        .collect();
    Some(SizeRule {
        rows: [grid_x.dim.clone(), grid_y.dim.clone()],
        ranges,
    })
}

fn grid_axes(tokens_per_launch_block: u32, heads_per_block: u32) -> (GridAxis, GridAxis) {
    (
        GridAxis {
            dim: "num_tokens".into(),
            per_block: tokens_per_launch_block,
            limit: i32::MAX as u32,
        },
        GridAxis {
            dim: "num_heads".into(),
            per_block: heads_per_block,
            limit: MAX_GRID_Y,
        },
    )
}

pub const GRID_RULE: &str =
    "x = ceil(num_tokens / (tokens_per_block * rows_per_thread)), y = ceil(num_heads / heads_per_block) (at most 65535), z = 1; no launch when num_tokens or num_heads is 0";
pub const FLAT_GRID_RULE: &str =
    "x = ceil(num_tokens / (tokens_per_block * heads_per_block)), y = num_heads (at most 65535), z = 1, read as one line of blocks; no launch when num_tokens or num_heads is 0";

impl Launch {
    pub fn for_variant(v: &MergeVariant) -> Launch {
        let size = v.dtype.size_bytes();
        if v.family == Family::MaskEmptyContextLse {
            // One thread per token, looping over heads_per_block heads: the generic grid rule
            // holds (x over tokens, y over groups of heads) with block_threads tokens per block.
            let (grid_x, grid_y) = grid_axes(v.schedule.block_threads, v.schedule.heads_per_block);
            return Launch {
                grid_x,
                grid_y,
                tokens_per_block: v.schedule.block_threads,
                block_threads: v.schedule.block_threads,
                heads_per_block: v.schedule.heads_per_block,
                threads_per_row: 1,
                vecs_per_thread: 1,
                rows_per_thread: 1,
                min_blocks_per_sm: v.schedule.min_blocks_per_sm,
                vec_elems: 1,
                vec_bytes: size,
                vec_words: 1,
                out_vec_bytes: size,
                out_vec_words: 1,
                vecs_per_row: 1,
                shared_mem_bytes: 0,
                grid_rule: GRID_RULE,
                flat_rows: false,
                pdl: v.pdl,
                size_rule: None,
                specializations: Vec::new(),
            };
        }
        let shape = BlockShape::of(v);
        let (vec_elems, threads_per_row) = (shape.vec_elems, shape.threads_per_row);
        let (rows_per_block, heads_per_block) = (shape.rows_per_block, shape.heads_per_block);
        let tokens_per_block = rows_per_block / heads_per_block;
        let rows_per_thread = v.schedule.rows_per_thread;
        let flat_rows = v.role.twin_of.contains(Twin::FewHeads);
        let (grid_x, grid_y) = if flat_rows {
            grid_axes(rows_per_block, 1)
        } else {
            grid_axes(tokens_per_block * rows_per_thread, heads_per_block)
        };
        let size_rule = size_rule_of(v, &grid_x, &grid_y);
        let specializations = v
            .specialization_twins()
            .iter()
            .map(MergeVariant::kernel_name)
            .collect();
        Launch {
            grid_x,
            grid_y,
            vec_elems,
            vec_bytes: vec_elems * size,
            vec_words: vec_elems * size / 4,
            out_vec_bytes: vec_elems * v.output.dtype(v.dtype).size_bytes(),
            out_vec_words: vec_elems * v.output.dtype(v.dtype).size_bytes() / 4,
            vecs_per_row: shape.vecs_per_row,
            threads_per_row,
            vecs_per_thread: shape.vecs_per_thread,
            tokens_per_block,
            block_threads: threads_per_row * rows_per_block,
            heads_per_block,
            rows_per_thread,
            min_blocks_per_sm: v.schedule.min_blocks_per_sm,
            shared_mem_bytes: 0,
            grid_rule: if flat_rows { FLAT_GRID_RULE } else { GRID_RULE },
            flat_rows,
            pdl: v.pdl,
            size_rule,
            specializations,
        }
    }

    /// Tokens one block covers.
    pub fn tokens_per_launch_block(&self) -> u32 {
        self.tokens_per_block * self.rows_per_thread
    }

    /// Grid for a problem size; `None` when there is nothing to launch or it exceeds the
    /// device's grid limits (launchers say which).
    pub fn grid(&self, num_tokens: u64, num_heads: u64) -> Option<[u32; 3]> {
        let y = num_heads.div_ceil(u64::from(self.grid_y.per_block));
        if num_tokens == 0 || num_heads == 0 || y > u64::from(MAX_GRID_Y) {
            return None;
        }
        let x = num_tokens.div_ceil(u64::from(self.grid_x.per_block));
        let x = u32::try_from(x).ok().filter(|&x| x <= i32::MAX as u32)?;
        Some([x, y as u32, 1])
    }
}

/// How a variant's rows fill a block (a pairwise, K-way or in-place merge).
pub(crate) struct BlockShape {
    vec_elems: u32,
    vecs_per_row: u32,
    vecs_per_thread: u32,
    threads_per_row: u32,
    rows_per_block: u32,
    /// The schedule's heads per block, halved until it divides the block's rows.
    pub(crate) heads_per_block: u32,
}

impl BlockShape {
    pub(crate) fn of(v: &MergeVariant) -> BlockShape {
        let size = v.dtype.size_bytes();
        // Widest power-of-two vector that divides the row: no partial vector at the row's end, so
        // contiguous tensors of any head size are always aligned for it.
        let mut vec_elems = MAX_VEC_BYTES / size;
        while v.head_size % vec_elems != 0 {
            vec_elems /= 2;
        }
        let vecs_per_row = v.head_size / vec_elems;
        // The schedule's vectors per thread, at least enough to keep a row within 128 threads and
        // at most the row's.
        let fewest = vecs_per_row.div_ceil(MAX_THREADS_PER_ROW);
        let vecs_per_thread = v
            .schedule
            .vecs_per_thread
            .clamp(fewest, vecs_per_row.max(fewest));
        let threads_per_row = vecs_per_row.div_ceil(vecs_per_thread);
        let rows_per_block = tokens_per_block(threads_per_row, v.schedule.block_threads);
        // Heads per block must divide the rows of a block; take the largest allowed that does.
        let mut heads_per_block = v.schedule.heads_per_block.max(1);
        while rows_per_block % heads_per_block != 0 {
            heads_per_block /= 2;
        }
        BlockShape {
            vec_elems,
            vecs_per_row,
            vecs_per_thread,
            threads_per_row,
            rows_per_block,
            heads_per_block,
        }
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Tokens per block: the block is a whole number of warps whenever the row width allows (a
/// partial last warp made ptxas cap d576 kernels at 32 registers and spill), near
/// the schedule's target block size.
fn tokens_per_block(threads_per_row: u32, target: u32) -> u32 {
    let warp_multiple = threads_per_row / gcd(threads_per_row, 32) * 32;
    if warp_multiple <= 1024 {
        let repeats = (target / warp_multiple).max(1);
        warp_multiple / threads_per_row * repeats
    } else {
        (target / threads_per_row).max(1)
    }
}

#[cfg(test)]
mod tests;
