//! What a kernel takes and how it is launched, derived from its variant. This is the single
//! description of the kernel ABI: the template renders the signature from `params`, the manifest
//! records it, and the runtime and bindings launch by it.

use serde::Serialize;

use crate::dtype::Dtype;
use crate::gen::variant::{Family, LseLayout, MergeVariant};

/// Widest access per thread: 16 bytes (one `ld.global.v4.b32`).
pub const MAX_VEC_BYTES: u32 = 16;
/// Threads that cooperate on one row stop growing here; longer rows loop.
pub const MAX_THREADS_PER_ROW: u32 = 128;
/// CUDA's limit on gridDim.y, which counts heads: launchers refuse more heads.
pub const MAX_GRID_Y: u32 = 65535;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// Device pointer to `elem` values.
    Pointer,
    /// 64-bit signed integer passed by value.
    I64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Param {
    pub name: &'static str,
    /// Spelling in the generated CUDA signature.
    pub c_type: String,
    pub kind: ParamKind,
    /// Element type behind a pointer ("f32" for lse arrays).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elem: Option<&'static str>,
    /// The kernel writes through it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub written: bool,
    /// Null is allowed and means "skip".
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub nullable: bool,
    pub doc: &'static str,
}

fn pointer(
    name: &'static str,
    elem: Dtype,
    written: bool,
    nullable: bool,
    doc: &'static str,
) -> Param {
    let c_elem = elem.info().c_type;
    Param {
        name,
        c_type: if written {
            format!("{c_elem}* __restrict__")
        } else {
            format!("const {c_elem}* __restrict__")
        },
        kind: ParamKind::Pointer,
        elem: Some(elem.name()),
        written,
        nullable,
        doc,
    }
}

/// A pointer the kernel both reads and writes (an in-place state): no `__restrict__`, since the
/// same thread reads each element before it writes it.
fn in_out(name: &'static str, elem: Dtype, doc: &'static str) -> Param {
    Param {
        name,
        c_type: format!("{}*", elem.info().c_type),
        kind: ParamKind::Pointer,
        elem: Some(elem.name()),
        written: true,
        nullable: false,
        doc,
    }
}

fn int64(name: &'static str, doc: &'static str) -> Param {
    Param {
        name,
        c_type: "long long".to_string(),
        kind: ParamKind::I64,
        elem: None,
        written: false,
        nullable: false,
        doc,
    }
}

/// The ordered parameter list of a kernel.
pub fn params(v: &MergeVariant) -> Vec<Param> {
    match v.family {
        Family::MergeAttnStates => pair_params(v),
        Family::MergeStates { num_states } => states_params(v, num_states.is_none()),
        Family::MergeStateInPlace { mask } => in_place_params(v, mask),
        Family::MaskEmptyContextLse => mask_lse_params(v),
    }
}

/// A read-only int32 array (request boundaries).
fn int32_array(name: &'static str, doc: &'static str) -> Param {
    Param {
        name,
        c_type: "const int* __restrict__".to_string(),
        kind: ParamKind::Pointer,
        elem: Some("i32"),
        written: false,
        nullable: false,
        doc,
    }
}

fn mask_lse_params(v: &MergeVariant) -> Vec<Param> {
    let lse_doc = match v.lse_layout {
        LseLayout::HeadMajor => {
            "[H, T] float32 lse, element (h, t) at h*T + t; set to -inf in place"
        }
        LseLayout::TokenMajor => {
            "[T, H] float32 lse, element (h, t) at t*H + h; set to -inf in place"
        }
    };
    vec![
        pointer("lse", Dtype::F32, true, false, lse_doc),
        int32_array(
            "query_start_loc",
            "[B + 1] int32: the tokens of request b are query_start_loc[b] .. query_start_loc[b+1]",
        ),
        int32_array(
            "context_start_loc",
            "[B + 1] int32: request b's context is empty when context_start_loc[b+1] == context_start_loc[b]",
        ),
        int64("num_requests", "B"),
        int64("num_tokens", "T"),
        int64("num_heads", "H"),
    ]
}

fn states_params(v: &MergeVariant, runtime_k: bool) -> Vec<Param> {
    let mut p = vec![pointer(
        "output",
        v.dtype,
        true,
        false,
        "[T, H, D] merged output, strides output_token_stride / output_head_stride",
    )];
    if v.output_lse {
        p.push(pointer(
            "output_lse",
            Dtype::F32,
            true,
            true,
            "[T, H] float32 merged log-sum-exp, element (t, h) at t*H + h; null = not written",
        ));
    }
    p.extend([
        pointer(
            "states",
            v.dtype,
            false,
            false,
            "[T, K, H, D] partial outputs, strides states_token/state/head_stride",
        ),
        pointer(
            "states_lse",
            Dtype::F32,
            false,
            false,
            "[T, K, H] float32, element (t, k, h) at (t*K + k)*H + h",
        ),
    ]);
    if runtime_k {
        p.push(int64("num_states", "K >= 1: states per token"));
    }
    p.extend([
        int64("num_tokens", "T"),
        int64("num_heads", "H"),
        int64("output_token_stride", "elements between tokens of output"),
        int64(
            "output_head_stride",
            "elements between heads of output (>= D)",
        ),
        int64("states_token_stride", "elements between tokens of states"),
        int64(
            "states_state_stride",
            "elements between the K states of a token",
        ),
        int64(
            "states_head_stride",
            "elements between heads of states (>= D)",
        ),
    ]);
    p
}

fn in_place_params(v: &MergeVariant, mask: bool) -> Vec<Param> {
    let lse_doc = match v.lse_layout {
        LseLayout::HeadMajor => "[H, T] float32, element (h, t) at h*T + t",
        LseLayout::TokenMajor => "[T, H] float32, element (h, t) at t*H + h",
    };
    let mut p = vec![
        in_out(
            "state",
            v.dtype,
            "[T, H, D] read, then overwritten with merge(state, other)",
        ),
        in_out(
            "state_lse",
            Dtype::F32,
            "the state's lse, read, then overwritten with the merged lse",
        ),
        pointer(
            "other",
            v.dtype,
            false,
            false,
            "[T, H, D] the state merged in",
        ),
        pointer("other_lse", Dtype::F32, false, false, lse_doc),
    ];
    if mask {
        p.push(Param {
            name: "mask",
            c_type: "const unsigned char* __restrict__".to_string(),
            kind: ParamKind::Pointer,
            elem: Some("u8"),
            written: false,
            nullable: true,
            doc: "[T] bytes: tokens whose byte is 0 are left untouched; null = merge every token",
        });
    }
    p.extend([
        int64("num_tokens", "T"),
        int64("num_heads", "H"),
        int64("state_token_stride", "elements between tokens of state"),
        int64(
            "state_head_stride",
            "elements between heads of state (>= D)",
        ),
        int64("other_token_stride", "elements between tokens of other"),
        int64(
            "other_head_stride",
            "elements between heads of other (>= D)",
        ),
    ]);
    p
}

fn pair_params(v: &MergeVariant) -> Vec<Param> {
    let lse_doc = match v.lse_layout {
        LseLayout::HeadMajor => "[H, T] float32, element (h, t) at h*T + t",
        LseLayout::TokenMajor => "[T, H] float32, element (h, t) at t*H + h",
    };
    let mut p = vec![pointer(
        "output",
        v.output.dtype(v.dtype),
        true,
        false,
        "[T, H, D] merged output, strides output_token_stride / output_head_stride",
    )];
    if v.output_lse {
        p.push(pointer(
            "output_lse",
            Dtype::F32,
            true,
            true,
            "merged log-sum-exp, same layout as the inputs' lse; null = not written",
        ));
    }
    p.extend([
        pointer(
            "prefix_output",
            v.dtype,
            false,
            false,
            "[T, H, D] prefix partial output",
        ),
        pointer("prefix_lse", Dtype::F32, false, false, lse_doc),
        pointer(
            "suffix_output",
            v.dtype,
            false,
            false,
            "[T, H, D] suffix partial output",
        ),
        pointer("suffix_lse", Dtype::F32, false, false, lse_doc),
    ]);
    if v.output == crate::gen::variant::OutputKind::Fp8E4m3 {
        p.push(pointer(
            "output_scale",
            Dtype::F32,
            false,
            false,
            "one float32: out = saturate(value / scale) in e4m3",
        ));
    }
    if v.fp8_group.is_some() {
        p.push(pointer(
            "output_scales",
            Dtype::F32,
            true,
            false,
            "written: one float32 per group, (t, h*D/G + g) at t*scale_token_stride + (h*D/G + g)*scale_group_stride",
        ));
    }
    p.extend([
        int64("num_tokens", "T"),
        int64("num_heads", "H"),
        int64("output_token_stride", "elements between tokens of output"),
        int64(
            "output_head_stride",
            "elements between heads of output (>= D)",
        ),
        int64(
            "prefix_token_stride",
            "elements between tokens of prefix_output",
        ),
        int64(
            "prefix_head_stride",
            "elements between heads of prefix_output (>= D)",
        ),
        int64(
            "suffix_token_stride",
            "elements between tokens of suffix_output",
        ),
        int64(
            "suffix_head_stride",
            "elements between heads of suffix_output (>= D)",
        ),
    ]);
    if v.fp8_group.is_some() {
        p.extend([
            int64(
                "scale_token_stride",
                "elements between tokens of output_scales",
            ),
            int64(
                "scale_group_stride",
                "elements between groups of output_scales",
            ),
        ]);
    }
    if v.prefix_threshold {
        p.push(int64(
            "prefill_tokens_with_context",
            "n in 0..=T: tokens t >= n copy the suffix (no context)",
        ));
    }
    p
}

/// How a variant's threads map onto rows, and the launch rule that follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
}

pub const GRID_RULE: &str =
    "x = ceil(num_tokens / (tokens_per_block * rows_per_thread)), y = ceil(num_heads / heads_per_block) (at most 65535), z = 1; no launch when num_tokens or num_heads is 0";

impl Launch {
    pub fn for_variant(v: &MergeVariant) -> Launch {
        let size = v.dtype.size_bytes();
        if v.family == Family::MaskEmptyContextLse {
            // One thread per token, looping over heads_per_block heads: the generic grid rule
            // holds (x over tokens, y over groups of heads) with block_threads tokens per block.
            return Launch {
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
            };
        }
        // Widest power-of-two vector that divides the row: no partial vector at the row's end, so
        // contiguous tensors of any head size are always aligned for it.
        let mut vec_elems = MAX_VEC_BYTES / size;
        while v.head_size % vec_elems != 0 {
            vec_elems /= 2;
        }
        let vecs_per_row = v.head_size / vec_elems;
        let vecs_per_thread = vecs_per_row.div_ceil(MAX_THREADS_PER_ROW);
        let threads_per_row = vecs_per_row.div_ceil(vecs_per_thread);
        let rows_per_block = tokens_per_block(threads_per_row, v.schedule.block_threads);
        // Heads per block must divide the rows of a block; take the largest allowed that does.
        let mut heads_per_block = v.schedule.heads_per_block.max(1);
        while rows_per_block % heads_per_block != 0 {
            heads_per_block /= 2;
        }
        let tokens_per_block = rows_per_block / heads_per_block;
        Launch {
            vec_elems,
            vec_bytes: vec_elems * size,
            vec_words: vec_elems * size / 4,
            out_vec_bytes: vec_elems * v.output.dtype(v.dtype).size_bytes(),
            out_vec_words: vec_elems * v.output.dtype(v.dtype).size_bytes() / 4,
            vecs_per_row,
            threads_per_row,
            vecs_per_thread,
            tokens_per_block,
            block_threads: threads_per_row * rows_per_block,
            heads_per_block,
            // A K-way merge keeps its K rows in flight instead of several tokens' rows.
            rows_per_thread: if matches!(v.family, Family::MergeStates { .. }) {
                1
            } else {
                v.schedule.rows_per_thread
            },
            min_blocks_per_sm: v.schedule.min_blocks_per_sm,
            shared_mem_bytes: 0,
            grid_rule: GRID_RULE,
        }
    }

    /// Tokens one block covers.
    pub fn tokens_per_launch_block(&self) -> u32 {
        self.tokens_per_block * self.rows_per_thread
    }

    /// Grid for a problem size; `None` when there is nothing to launch or it exceeds the
    /// device's grid limits (launchers say which).
    pub fn grid(&self, num_tokens: u64, num_heads: u64) -> Option<[u32; 3]> {
        let y = num_heads.div_ceil(u64::from(self.heads_per_block));
        if num_tokens == 0 || num_heads == 0 || y > u64::from(MAX_GRID_Y) {
            return None;
        }
        let x = num_tokens.div_ceil(u64::from(self.tokens_per_launch_block()));
        let x = u32::try_from(x).ok().filter(|&x| x <= i32::MAX as u32)?;
        Some([x, y as u32, 1])
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
mod tests {
    use super::*;
    use crate::gen::variant::OutputKind;

    fn variant(dtype: Dtype, head_size: u32) -> MergeVariant {
        MergeVariant {
            family: Family::MergeAttnStates,
            dtype,
            head_size,
            prefix_threshold: true,
            output_lse: true,
            output: OutputKind::Same,
            fp8_group: None,
            lse_layout: LseLayout::HeadMajor,
            schedule: crate::gen::variant::FALLBACK_SCHEDULE,
            explicit_schedule: false,
        }
    }

    #[test]
    fn vector_width_is_the_widest_that_divides_the_row() {
        let l = Launch::for_variant(&variant(Dtype::Bf16, 128));
        assert_eq!((l.vec_elems, l.vec_bytes, l.threads_per_row), (8, 16, 16));
        assert_eq!((l.tokens_per_block, l.block_threads), (16, 256));
        let l = Launch::for_variant(&variant(Dtype::Bf16, 576));
        assert_eq!(
            (l.vec_elems, l.threads_per_row, l.tokens_per_block),
            (8, 72, 4)
        );
        assert_eq!(l.block_threads % 32, 0);
        for tpr in 1..=128 {
            let block = tpr * tokens_per_block(tpr, 256);
            assert!(block <= 1024, "threads_per_row {tpr}");
            if (tpr / gcd(tpr, 32)) * 32 <= 1024 {
                assert_eq!(block % 32, 0, "threads_per_row {tpr}: block {block}");
            }
        }
        let l = Launch::for_variant(&variant(Dtype::F32, 80));
        assert_eq!((l.vec_elems, l.threads_per_row), (4, 20));
        let l = Launch::for_variant(&variant(Dtype::Bf16, 100));
        assert_eq!((l.vec_elems, l.vec_bytes), (4, 8));
        let l = Launch::for_variant(&variant(Dtype::F16, 1));
        assert_eq!(
            (l.vec_elems, l.threads_per_row, l.block_threads),
            (1, 1, 256)
        );
    }

    #[test]
    fn long_rows_loop_instead_of_growing_the_block() {
        let l = Launch::for_variant(&variant(Dtype::F32, 1023));
        assert_eq!(l.vec_elems, 1);
        assert_eq!(l.vecs_per_thread, 8);
        assert_eq!(l.threads_per_row, 128);
        assert!(l.threads_per_row * l.vecs_per_thread >= l.vecs_per_row);
        assert!(l.block_threads <= 1024);
    }

    #[test]
    fn grid_caps_heads_and_skips_empty_problems() {
        let l = Launch::for_variant(&variant(Dtype::Bf16, 128));
        assert_eq!(l.grid(17, 8), Some([2, 8, 1]));
        assert_eq!(l.grid(1, 65535), Some([1, 65535, 1]));
        assert_eq!(l.grid(1, 65536), None);
        let mut v = variant(Dtype::Bf16, 128);
        v.schedule.rows_per_thread = 4;
        assert_eq!(Launch::for_variant(&v).grid(65, 2), Some([2, 2, 1]));
        assert_eq!(l.grid(0, 8), None);
        assert_eq!(l.grid(8, 0), None);
    }

    #[test]
    fn params_follow_the_options() {
        let mut v = variant(Dtype::Bf16, 128);
        let names: Vec<_> = params(&v).iter().map(|p| p.name).collect();
        assert_eq!(names[..2], ["output", "output_lse"]);
        assert_eq!(names.last(), Some(&"prefill_tokens_with_context"));
        v.output_lse = false;
        v.prefix_threshold = false;
        let names: Vec<_> = params(&v).iter().map(|p| p.name).collect();
        assert!(!names.contains(&"output_lse"));
        assert!(!names.contains(&"prefill_tokens_with_context"));
        assert_eq!(names.len(), 5 + 8);
    }
}
