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

/// A pairwise merge of `t` tokens of `h` heads of 128 (the threshold `n`), tensors 1 MiB apart
/// from 1 MiB on: the dense kernel's contract passes it.
fn merge_call(t: i64, h: i64, n: i64) -> Vec<(&'static str, super::Arg<'static>)> {
    use super::Arg;
    let d = 128;
    let buf = |at: u64, len: i64, elem| Arg::Buffer {
        ptr: at << 20,
        len: len as u64,
        elem: Some(elem),
    };
    vec![
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
        ("prefill_tokens_with_context", Arg::Int(n)),
    ]
}

/// Arguments bind by name in any order (signature order is only the fast case), and a name
/// given twice is refused wherever the second one stands.
#[test]
fn arguments_bind_by_name_in_any_order() {
    let p = dense_plan();
    let mut args = merge_call(4, 2, 3);
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

/// The memo of the last call that passed (memo.rs) changes no verdict: right after a passing
/// call, each call below gets exactly what a plan that never saw one gives it, a call of the
/// same layout at other addresses as much as one of another layout or with a misaligned or
/// overlapping buffer.
#[test]
fn a_call_after_a_passing_one_gets_the_full_checks_verdict() {
    use super::Arg;
    let fresh = dense_plan();
    let primed = dense_plan();
    let good = merge_call(4, 2, 3);
    let with = |name: &'static str, arg: Arg<'static>| {
        let mut call = good.clone();
        match call.iter_mut().find(|(n, _)| *n == name) {
            Some(slot) => slot.1 = arg,
            None => call.push((name, arg)),
        }
        call
    };
    let moved = |name: &'static str, by: i64| {
        let at = good.iter().find(|(n, _)| *n == name).unwrap().1;
        let Arg::Buffer { ptr, len, elem } = at else {
            unreachable!()
        };
        let ptr = ptr.wrapping_add_signed(by);
        with(name, Arg::Buffer { ptr, len, elem })
    };
    let mut elsewhere = good.clone();
    for (_, arg) in &mut elsewhere {
        if let Arg::Buffer { ptr, .. } = arg {
            *ptr += 64 << 20;
        }
    }
    let overlapping = {
        let Arg::Buffer { ptr, .. } = good[2].1 else {
            unreachable!()
        };
        moved("output", (ptr - (1 << 20)) as i64 + 256)
    };
    let calls = [
        ("the same layout elsewhere", elsewhere),
        ("output misaligned", moved("output", 2)),
        ("output_lse misaligned", moved("output_lse", 2)),
        ("output_lse 16 bytes on", moved("output_lse", 16)),
        ("output over prefix_output", overlapping),
        ("no output_lse", with("output_lse", Arg::Null)),
        (
            "more tokens than the buffers hold",
            with("num_tokens", Arg::Int(5)),
        ),
        (
            "a padded head stride",
            with("output_head_stride", Arg::Int(136)),
        ),
        (
            "threshold past T",
            with("prefill_tokens_with_context", Arg::Int(5)),
        ),
        ("head_size passed", with("head_size", Arg::Int(128))),
        ("a wrong head_size", with("head_size", Arg::Int(64))),
        ("no tokens", with("num_tokens", Arg::Int(0))),
    ];
    for (what, call) in &calls {
        let want = fresh.check(call);
        assert_eq!(primed.check(&good), fresh.check(&good));
        assert!(primed.memo.holds_a_call(), "{what}: the good call is kept");
        assert_eq!(primed.check(call), want, "{what}");
        // Again, with the memo now holding this call where it passed.
        assert_eq!(primed.check(call), want, "{what}, twice");
    }
    let refused = |what: &str| {
        let (_, call) = calls.iter().find(|(w, _)| *w == what).unwrap();
        fresh.check(call).unwrap_err().problem
    };
    assert!(refused("output misaligned").contains("is not aligned to 16 bytes"));
    assert!(refused("output over prefix_output").contains("overlaps"));
    assert!(refused("more tokens than the buffers hold").contains("elements, it has"));
}
