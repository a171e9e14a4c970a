//! Unit tests of the check against the committed manifest (src/host/check.rs).

use crate::host::manifest::ManifestView;

fn dense_plan() -> super::Plan {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/generated/manifest.json");
    let text = std::fs::read(path).unwrap();
    let m = ManifestView::parse(std::path::Path::new(path), &text).unwrap();
    let k = m
        .kernels
        .iter()
        .find(|k| k.name == "merge_attn_states_bf16_d128_thr_lse_dense");
    k.unwrap().plan().unwrap()
}

/// Values another kernel's check would pass on: T tokens of H heads, every tensor with
/// this head stride and its heads packed.
fn values(plan: &super::Plan, t: u64, h: u64, head_stride: u64) -> Vec<u64> {
    plan.param_names()
        .map(|name| match name {
            "num_tokens" => t,
            "num_heads" => h,
            "prefill_tokens_with_context" => t / 2,
            n if n.ends_with("_token_stride") => h.wrapping_mul(head_stride),
            n if n.ends_with("_head_stride") => head_stride,
            _ => 0x1000, // a pointer: no bound reads it
        })
        .collect()
}

/// Arguments bind by name in any order (signature order is only the fast case), and a name
/// given twice is refused wherever the second one stands.
#[test]
fn arguments_bind_by_name_in_any_order() {
    use super::Arg;
    let p = dense_plan();
    let (t, h, d) = (4i64, 2i64, 128i64);
    let buf = |at: u64, len: i64, elem| Arg::Buffer {
        ptr: at << 20,
        len: len as u64,
        elem: Some(elem),
    };
    let mut args: Vec<(&str, Arg)> = vec![
        ("output", buf(1, t * h * d, "bf16")),
        ("output_lse", buf(2, t * h, "f32")),
        ("prefix_output", buf(3, t * h * d, "bf16")),
        ("prefix_lse", buf(4, t * h, "f32")),
        ("suffix_output", buf(5, t * h * d, "bf16")),
        ("suffix_lse", buf(6, t * h, "f32")),
        ("num_tokens", Arg::Int(t)),
        ("num_heads", Arg::Int(h)),
        ("output_token_stride", Arg::Int(h * d)),
        ("output_head_stride", Arg::Int(d)),
        ("prefix_token_stride", Arg::Int(h * d)),
        ("prefix_head_stride", Arg::Int(d)),
        ("suffix_token_stride", Arg::Int(h * d)),
        ("suffix_head_stride", Arg::Int(d)),
        ("prefill_tokens_with_context", Arg::Int(3)),
    ];
    let in_order = p.check(&args).unwrap().values().to_vec();
    args.reverse();
    assert_eq!(p.check(&args).unwrap().values(), in_order);
    args.rotate_left(5);
    assert_eq!(p.check(&args).unwrap().values(), in_order);
    for repeat in [0, 7, args.len() - 1] {
        let mut twice = args.clone();
        twice.push(args[repeat]);
        let e = p.check(&twice).unwrap_err();
        assert!(e.problem.ends_with("is given twice"), "{}", e.problem);
    }
}

#[test]
fn a_specialization_accepts_only_values_that_surely_meet_its_bounds() {
    let p = dense_plan();
    assert!(p.accepts_values(&values(&p, 40, 4, 128)));
    assert!(!p.accepts_values(&values(&p, 40, 4, 136)), "padded heads");
    assert!(p.accepts_values(&values(&p, (1 << 31) - 1, 1, 128)));
    assert!(
        !p.accepts_values(&values(&p, 1 << 31, 1, 128)),
        "past its row limit"
    );
    // num_heads * 128 overflows: the check lets such a bound pass, a specialization does not.
    assert!(!p.accepts_values(&values(&p, 0, 1 << 57, 128)));
    assert!(
        !p.accepts_values(&values(&p, 40, 4, 128)[1..]),
        "values of another signature"
    );
}
