//! Unit tests of the parent module.

use super::*;
use crate::dtype::Dtype;

fn variant(dtype: Dtype, head_size: u32) -> MergeVariant {
    MergeVariant::merge_attn_states(dtype, head_size)
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
