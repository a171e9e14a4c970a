//! Unit tests of the parent module.

use super::*;

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
        mask_empty_context: false,
        pdl: false,
    }
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
