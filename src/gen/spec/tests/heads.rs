//! Heads per block: the FP8 outputs' and the token-major in-place merge's blocks of 8 adjacent
//! heads, the `_flat` dense twins that serve calls with fewer heads than a block holds, and the
//! K-way merge's tokens per thread.

use super::*;

#[test]
fn fp8_outputs_cover_eight_heads_per_block_unless_the_spec_says() {
    // bf16 d128's tuned schedule has one head per block; its FP8 outputs take 8, the bf16 output
    // keeps 1, a spec's heads_per_block wins, and a block with fewer rows gets what divides them.
    let heads = |spec: &str| -> Vec<(String, u32)> {
        let s = parse("t.toml", spec).unwrap();
        s.variants
            .iter()
            .map(|v| {
                (
                    v.kernel_name(),
                    crate::gen::launch::Launch::for_variant(v).heads_per_block,
                )
            })
            .collect()
    };
    let table = "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nsize_rule = false\ndense = false\n";
    let outputs = "output = [\"same\", \"fp8_e4m3\", \"fp8_e4m3_group\"]\ngroup_size = 128\n";
    let got = heads(&format!("{table}{outputs}"));
    assert_eq!(
        got.iter().map(|(_, h)| *h).collect::<Vec<_>>(),
        [1, 8, 8],
        "{got:?}"
    );
    let got = heads(&format!("{table}{outputs}heads_per_block = 2\n"));
    assert!(got.iter().all(|(_, h)| *h == 2), "{got:?}");
    // f32 d576: 72 threads per row, 4 rows in its block (288 threads): 4 heads per block.
    let got = heads("[[merge_attn_states]]\ndtype = \"f32\"\nhead_size = 576\noutput = \"fp8_e4m3\"\nsize_rule = false\ndense = false\n");
    assert_eq!(got[0].1, 4, "{got:?}");
}

#[test]
fn pairwise_merges_with_heads_per_block_get_flat_row_twins_for_fewer_heads() {
    // (name, flat rows, num_heads' max, num_tokens' min, grid per block x, y) of every kernel a
    // spec makes.
    type Row = (String, bool, Option<String>, String, u32, u32);
    let kernels = |spec: &str| -> Vec<Row> {
        let s = parse("t.toml", spec).unwrap();
        s.variants
            .iter()
            .map(|v| {
                let c = crate::gen::abi::contract(v);
                let bounds = |name: &str| {
                    let p = c.params.iter().find(|p| p.name == name).unwrap();
                    p.bounds.clone().unwrap()
                };
                let (x, y) = (c.launch.grid_x.per_block, c.launch.grid_y.per_block);
                let (max, min) = (bounds("num_heads").max, bounds("num_tokens").min);
                let flat = v.role.twin_of.contains(Twin::FewHeads);
                (v.kernel_name(), flat, max, min, x, y)
            })
            .collect()
    };
    let row = |general: &str, tag: &str, flat: bool, max: Option<&str>, min: &str, x, y| {
        let max = max.map(String::from);
        (format!("{general}{tag}"), flat, max, min.to_string(), x, y)
    };
    let got = kernels(
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3\"\n",
    );
    let general = "merge_attn_states_bf16_d128_thr_lse_fp8";
    // 8 heads x 4 tokens per block of 512 threads, 16 per row: the flat twins take 32 rows a
    // block, the grid's y counting heads, and only calls with fewer than 8 heads.
    assert_eq!(
        got,
        [
            row(general, "", false, None, "0", 4, 8),
            row(general, "_dense_nothr_flat", true, Some("7"), "0", 32, 1),
            row(general, "_dense_flat", true, Some("7"), "0", 32, 1),
            row(general, "_dense_nothr", false, None, "0", 4, 8),
            row(general, "_dense", false, None, "0", 4, 8),
        ]
    );
    let specs = crate::gen::abi::contract(
        &parse(
            "t.toml",
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3\"\n",
        )
        .unwrap()
        .variants[0],
    )
    .launch
    .specializations;
    assert_eq!(
        specs,
        got[1..].iter().map(|k| k.0.clone()).collect::<Vec<_>>()
    );
    // The bound follows the heads a block really holds: f32 d576's blocks hold 4.
    let got =
        kernels("[[merge_attn_states]]\ndtype = \"f32\"\nhead_size = 576\noutput = \"fp8_e4m3\"\n");
    assert_eq!(got[1].2.as_deref(), Some("3"), "{got:?}");
    // The inputs' dtype: at most half the heads a block holds, and at least 128 blocks' tokens
    // (here 128 x 32 rows: 4096).
    let got = kernels(
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nsize_rule = false\nheads_per_block = 8\nblock_threads = 512\n",
    );
    let general = "merge_attn_states_bf16_d128_thr_lse_r1m1b512h8";
    assert_eq!(
        got[..3],
        [
            row(general, "", false, None, "0", 4, 8),
            row(general, "_dense_nothr_flat", true, Some("4"), "4096", 32, 1),
            row(general, "_dense_flat", true, Some("4"), "4096", 32, 1),
        ]
    );
    // None where a block holds one head, or with the fused mask.
    for spec in [
        "output = \"fp8_e4m3\"\nheads_per_block = 1\n",
        "output = \"same\"\nheads_per_block = 1\n",
        "output = \"fp8_e4m3\"\nmask_empty_context = true\n",
    ] {
        let got = kernels(&format!(
            "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nsize_rule = false\n{spec}"
        ));
        assert!(got.iter().all(|k| !k.1 && k.2.is_none()), "{spec}: {got:?}");
    }
}

#[test]
fn in_place_merges_with_token_major_lse_take_blocks_of_eight_heads_and_k_way_rows_per_thread() {
    // (block threads, heads per block, tokens per launch block) of every kernel a spec makes.
    let shapes = |spec: &str| -> Vec<(u32, u32, u32)> {
        let s = parse("t.toml", spec).unwrap();
        s.variants
            .iter()
            .map(|v| {
                let l = crate::gen::launch::Launch::for_variant(v);
                (l.block_threads, l.heads_per_block, l.grid_x.per_block)
            })
            .collect()
    };
    // bf16 d128: token-major lse takes the K-way merge's 128-thread blocks of 8 heads (one
    // token a block), head-major the pairwise merge's tuned 512 threads of one head (32 tokens).
    let in_place = "[[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\n";
    let got = shapes(&format!(
        "{in_place}lse_layout = [\"token_major\", \"head_major\"]\n"
    ));
    assert_eq!(got, [(128, 8, 1), (512, 1, 32)]);
    // A spec's schedule keys still win.
    let got = shapes(&format!(
        "{in_place}lse_layout = \"token_major\"\nblock_threads = 256\nheads_per_block = 2\n"
    ));
    assert_eq!(got, [(256, 2, 8)]);
    // K-way rows per thread: each thread takes that many tokens, the grid that many fewer blocks.
    let got = shapes(
        "[[merge_states]]\ndtype = \"bf16\"\nhead_size = 64\nnum_states = \"runtime\"\nrows_per_thread = [1, 2]\n",
    );
    assert_eq!(got, [(128, 8, 2), (128, 8, 4)]);
}
