//! Tuned schedules, size rules and dense specializations: what specs/tuned.toml and the
//! `size_rule` and `dense` keys make of a spec's kernels.

use super::*;

#[test]
fn every_tuned_entry_reaches_the_variants() {
    // A tuned table that fails to parse would silently fall back to the default schedule.
    let file: TunedFile = toml::from_str(TUNED_SCHEDULES).expect("specs/tuned.toml parses");
    assert!(!file.schedule.is_empty());
    let spec = default_spec().unwrap();
    for e in &file.schedule {
        let dtype = Dtype::from_name(&e.dtype).expect("known dtype");
        let want = Schedule {
            rows_per_thread: e.rows_per_thread,
            min_blocks_per_sm: e.min_blocks_per_sm,
            block_threads: e.block_threads,
            heads_per_block: e.heads_per_block,
            vecs_per_thread: 0,
        };
        assert_eq!(tuned_schedule(dtype, e.head_size), want);
        // (The kernels a size rule covers take its schedules: tested below.)
        let ruled = |v: &MergeVariant| {
            v.output == OutputKind::Same && tuned_size_rule(v.dtype, v.head_size).is_some()
        };
        // (The K-way and in-place merges and the lse mask take schedules of their own.)
        for v in spec.variants.iter().filter(|v| {
            v.family == Family::MergeAttnStates
                && v.dtype == dtype
                && v.head_size == e.head_size
                && !ruled(v)
        }) {
            // A fused mask's blocks are at most 256 threads, and may ask for more blocks per SM
            // (fused_mask_schedule), as group FP8 does (check_launch); an FP8 output's blocks
            // cover at least 8 heads (check_launch); the rest of the schedule is the tuned one.
            let want = if v.mask_empty_context {
                fused_mask_schedule(want)
            } else {
                want
            };
            let want = if v.mask_empty_context || v.fp8_group.is_some() {
                Schedule {
                    min_blocks_per_sm: v.schedule.min_blocks_per_sm,
                    ..want
                }
            } else {
                want
            };
            let want = if v.output == OutputKind::Same {
                want
            } else {
                Schedule {
                    heads_per_block: want.heads_per_block.max(8),
                    ..want
                }
            };
            assert_eq!(v.schedule, want, "{}", v.kernel_name());
            assert!(!v.explicit_schedule);
        }
    }
}

/// The first size rule of specs/tuned.toml, as (dtype, head size, ranges).
fn first_tuned_rule() -> (String, u32, Vec<(Option<u64>, Schedule)>) {
    let file: TunedFile = toml::from_str(TUNED_SCHEDULES).expect("specs/tuned.toml parses");
    let r = file
        .size_rule
        .first()
        .expect("the tuned table has a size rule");
    let ranges = r
        .ranges
        .iter()
        .map(|x| {
            let s = Schedule {
                rows_per_thread: x.rows_per_thread,
                min_blocks_per_sm: x.min_blocks_per_sm,
                block_threads: x.block_threads,
                heads_per_block: x.heads_per_block,
                vecs_per_thread: x.vecs_per_thread,
            };
            (x.below_rows, s)
        })
        .collect();
    (r.dtype.clone(), r.head_size, ranges)
}

#[test]
fn every_tuned_size_rule_is_well_formed_and_reaches_the_default_spec() {
    let file: TunedFile = toml::from_str(TUNED_SCHEDULES).expect("specs/tuned.toml parses");
    let spec = default_spec().unwrap();
    for r in &file.size_rule {
        let what = format!("size rule {} d{}", r.dtype, r.head_size);
        // Ascending bounds, every range but the last bounded, schedules a spec could set.
        let (last, smaller) = r.ranges.split_last().expect(&what);
        assert!(
            last.below_rows.is_none(),
            "{what}: the last range has no bound"
        );
        let bounds: Vec<u64> = smaller.iter().map(|x| x.below_rows.expect(&what)).collect();
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]) && bounds.iter().all(|&b| b > 0),
            "{what}"
        );
        for x in &r.ranges {
            assert!(BLOCK_THREADS_ALLOWED.contains(&x.block_threads), "{what}");
            assert!(
                HEADS_PER_BLOCK_ALLOWED.contains(&x.heads_per_block),
                "{what}"
            );
            assert!(
                ROWS_PER_THREAD_ALLOWED.contains(&x.rows_per_thread),
                "{what}"
            );
        }
        let dtype = Dtype::from_name(&r.dtype).expect("known dtype");
        let main = spec
            .variants
            .iter()
            .find(|v| v.dtype == dtype && v.head_size == r.head_size && v.role.rows_below.is_none())
            .expect("the default spec has the kernel");
        assert_eq!(main.schedule.block_threads, last.block_threads, "{what}");
        assert_eq!(
            main.schedule.heads_per_block, last.heads_per_block,
            "{what}"
        );
        assert_eq!(main.size_rule.len(), smaller.len(), "{what}");
        for (range, x) in main.size_rule.iter().zip(smaller) {
            assert_eq!(Some(range.below_rows), x.below_rows);
            let name = format!("{}_below{}", main.kernel_name(), range.below_rows);
            let alt = spec
                .find(&name)
                .unwrap_or_else(|| panic!("{name} is generated"));
            assert_eq!(alt.schedule, range.schedule);
            assert_eq!(alt.role.rows_below, Some(range.below_rows));
            assert!(alt.size_rule.is_empty());
        }
    }
}

#[test]
fn the_size_rule_applies_to_the_tuned_merge_only_and_can_be_turned_off() {
    let (dtype, head, ranges) = first_tuned_rule();
    let table =
        format!("[[merge_attn_states]]\ndtype = \"{dtype}\"\nhead_size = {head}\ndense = false\n");
    let s = parse("t.toml", &table).unwrap();
    let main = format!("merge_attn_states_{dtype}_d{head}_thr_lse");
    let mut want = vec![main.clone()];
    want.extend(
        ranges[..ranges.len() - 1]
            .iter()
            .map(|(b, _)| format!("{main}_below{}", b.unwrap())),
    );
    assert_eq!(s.kernel_names(), want);
    // Off: the one kernel, with the rule's schedule for the largest launches.
    let off = parse("t.toml", &format!("{table}size_rule = false\n")).unwrap();
    assert_eq!(off.kernel_names(), std::slice::from_ref(&main));
    assert!(off.variants[0].size_rule.is_empty());
    // Not timed by the tuner, so no rule: FP8 outputs, the fused mask, the spec's own schedule.
    for extra in [
        "output = \"fp8_e4m3\"\n",
        "mask_empty_context = true\n",
        "block_threads = 256\n",
    ] {
        let s = parse("t.toml", &format!("{table}{extra}")).unwrap();
        assert_eq!(s.variants.len(), 1, "{extra}");
        assert!(s.variants[0].size_rule.is_empty(), "{extra}");
    }
    // Refused where it means nothing.
    assert_eq!(
        err(&format!("{table}size_rule = true\nblock_threads = 256\n")),
        "t.toml:5:13: `size_rule` = true picks among the tuned schedules, and this table sets its own schedule: remove `size_rule` or the schedule keys"
    );
    assert_eq!(
        err(&format!("{table}size_rule = \"yes\"\n")),
        "t.toml:5:13: `size_rule`: expected true or false, got \"yes\""
    );
    let e = err(
        "[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\nsize_rule = false\n",
    );
    assert!(
        e.contains("`size_rule` is not a key of [[merge_states]]"),
        "{e}"
    );
}

#[test]
fn every_pairwise_kernel_gets_a_dense_specialization_unless_the_spec_says_dense_false() {
    let s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n\
         [[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\n",
    )
    .unwrap();
    let names = s.kernel_names();
    // bf16 d64's tuned size rule (specs/tuned.toml): each smaller range a kernel, each kernel
    // followed by its two dense specializations, and before them the two `_flat` ones where its
    // blocks hold several heads.
    let (_, head, ranges) = first_tuned_rule();
    assert_eq!(head, 64, "the test reads bf16 d64's rule");
    let general = "merge_attn_states_bf16_d64_thr_lse";
    let mut want: Vec<String> = Vec::new();
    let bounds = ranges.iter().filter_map(|(below, _)| *below);
    for kernel in std::iter::once(general.to_string())
        .chain(bounds.map(|rows| format!("{general}_below{rows}")))
    {
        let v = s
            .variants
            .iter()
            .find(|v| v.kernel_name() == kernel)
            .unwrap();
        let several_heads = crate::gen::launch::BlockShape::of(v).heads_per_block > 1;
        let flat = [
            format!("{kernel}_dense_nothr_flat"),
            format!("{kernel}_dense_flat"),
        ];
        let twins = [format!("{kernel}_dense_nothr"), format!("{kernel}_dense")];
        want.push(kernel);
        want.extend(flat.into_iter().filter(|_| several_heads));
        want.extend(twins);
    }
    want.push("merge_state_in_place_bf16_d128".into());
    assert_eq!(names, want);
    // The general kernel names its specializations in the order hosts try them; their strides
    // are bound to the dense ones and their rows to 32 bits, the first's threshold to T.
    let launch = crate::gen::launch::Launch::for_variant(&s.variants[0]);
    assert_eq!(
        launch.specializations,
        [
            "merge_attn_states_bf16_d64_thr_lse_dense_nothr",
            "merge_attn_states_bf16_d64_thr_lse_dense"
        ]
    );
    let all_context = crate::gen::abi::contract(&s.variants[1]);
    let threshold = all_context
        .params
        .iter()
        .find(|p| p.name == "prefill_tokens_with_context")
        .and_then(|p| p.bounds.clone())
        .unwrap();
    assert_eq!(
        (threshold.min.as_str(), threshold.max.as_deref()),
        ("num_tokens", Some("num_tokens"))
    );
    let twin = crate::gen::abi::contract(&s.variants[2]);
    assert!(twin.launch.specializations.is_empty() && twin.launch.size_rule.is_none());
    let bound = |name: &str| {
        let b = twin
            .params
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .bounds
            .clone()
            .unwrap();
        (b.min, b.max.unwrap())
    };
    assert_eq!(
        bound("prefix_token_stride"),
        ("num_heads*64".into(), "num_heads*64".into())
    );
    assert_eq!(bound("output_head_stride"), ("64".into(), "64".into()));
    assert_eq!(twin.limits.len(), 1);
    assert_eq!(twin.limits[0].expr, "num_tokens*num_heads");
    assert!(crate::gen::abi::contract(&s.variants[0]).limits.is_empty());
    let off = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\ndense = false\n",
    )
    .unwrap();
    let without_twins: Vec<&String> = want
        .iter()
        .filter(|n| n.starts_with("merge_attn_states") && !n.contains("_dense"))
        .collect();
    assert_eq!(off.kernel_names().iter().collect::<Vec<_>>(), without_twins);
    assert!(crate::gen::launch::Launch::for_variant(&off.variants[0])
        .specializations
        .is_empty());
    let e = err("[[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\ndense = true\n");
    assert!(e.contains("`dense` is not a key of"), "{e}");
    let e = err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\ndense = 1\n");
    assert!(e.contains("`dense`"), "{e}");
}

#[test]
fn group_fp8_asks_for_full_occupancy_except_float32_rows_with_the_fused_mask() {
    let s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 128\nmask_empty_context = [false, true]\ndense = false\n",
    )
    .unwrap();
    assert_eq!(s.variants.len(), 4);
    for v in &s.variants {
        let block = crate::gen::launch::Launch::for_variant(v).block_threads;
        let full = (MAX_THREADS_PER_SM / block).max(1);
        // (float32 fused-mask rows spilled at the 32 registers full occupancy leaves them)
        let spills_at_full = v.dtype == Dtype::F32 && v.mask_empty_context;
        assert_eq!(
            v.schedule.min_blocks_per_sm == full,
            !spills_at_full,
            "{}: {} blocks of {block}",
            v.kernel_name(),
            v.schedule.min_blocks_per_sm
        );
    }
}
