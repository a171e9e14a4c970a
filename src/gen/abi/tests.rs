//! Unit tests of the parent module.

use super::*;

fn variant(dtype: Dtype, head_size: u32) -> MergeVariant {
    MergeVariant::merge_attn_states(dtype, head_size)
}

#[test]
fn params_follow_the_options() {
    let mut v = variant(Dtype::Bf16, 128);
    let all = params(&v);
    let names: Vec<_> = all.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names[..2], ["output", "output_lse"]);
    assert_eq!(names.last(), Some(&"prefill_tokens_with_context"));
    v.output_lse = false;
    v.prefix_threshold = false;
    let all = params(&v);
    let names: Vec<_> = all.iter().map(|p| p.name.as_str()).collect();
    assert!(!names.contains(&"output_lse"));
    assert!(!names.contains(&"prefill_tokens_with_context"));
    assert_eq!(names.len(), 5 + 8);
}
