//! Unit tests of the parent module.

use super::*;
use crate::gen::spec;

#[test]
fn the_table_lists_the_kinds_in_declaration_order() {
    // TwinSet's bits are the kinds' discriminants, which must be their rows.
    for (row, kind) in TWIN_KINDS.iter().enumerate() {
        assert_eq!(kind.twin as usize, row, "{}", kind.key);
        assert_eq!(TwinSet::of(&[kind.twin]).kinds().count(), 1);
    }
    // Distinct priorities: two twins never tie in rank, so the order is total.
    let mut priorities: Vec<u32> = TWIN_KINDS.iter().map(|k| k.priority).collect();
    priorities.sort();
    priorities.dedup();
    assert_eq!(priorities.len(), TWIN_KINDS.len());
    let keys: Vec<&str> = TWIN_KINDS.iter().map(|k| k.key).collect();
    assert_eq!(keys, ["dense", "all_context", "flat_rows"]);
}

#[test]
fn twins_are_the_combinations_with_the_base_kind_narrowest_first() {
    let tags = |kinds: &[Twin]| -> Vec<String> {
        let sets = Role::offering(kinds).twin_sets();
        sets.into_iter().map(TwinSet::tags).collect()
    };
    let all = [Twin::Dense, Twin::AllContext, Twin::FewHeads];
    assert_eq!(
        tags(&all),
        ["_dense_nothr_flat", "_dense_flat", "_dense_nothr", "_dense"]
    );
    assert_eq!(
        tags(&[Twin::Dense, Twin::FewHeads]),
        ["_dense_flat", "_dense"]
    );
    assert_eq!(tags(&[Twin::Dense]), ["_dense"]);
    // Without the base kind (the spec's `dense = false`) there are none, whatever else.
    assert!(tags(&[Twin::AllContext, Twin::FewHeads]).is_empty());
    assert!(tags(&[]).is_empty());
}

#[test]
fn the_manifest_keys_of_a_role_are_the_old_flags_in_their_order() {
    let json = |role: Role| serde_json::to_string(&role).unwrap();
    assert_eq!(json(Role::default()), "{}");
    let general = Role::offering(&[Twin::Dense, Twin::AllContext, Twin::FewHeads]);
    assert_eq!(
        json(general),
        r#"{"dense_specialization":true,"flat_twins":true}"#
    );
    let twin = Role {
        rows_below: Some(4096),
        twin_of: TwinSet::of(&[Twin::FewHeads, Twin::Dense, Twin::AllContext]),
        twins: TwinSet::EMPTY,
    };
    assert_eq!(
        json(twin),
        r#"{"rows_below":4096,"dense":true,"all_context":true,"flat_rows":true}"#
    );
    assert_eq!(twin.name_suffix(), "_below4096_dense_nothr_flat");
    assert!(!twin.is_named() && general.is_named());
}

#[test]
fn the_decision_list_says_each_familys_order() {
    let s = spec::parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = [64, 128]\noutput = [\"same\", \"fp8_e4m3\"]\n\
         [[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\n",
    )
    .unwrap();
    let list = decision_list(&s.variants);
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines[0], "merge_attn_states (4 kernels callers name):");
    assert!(lines[1].starts_with("  1. size rule ("), "{list}");
    let twins: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split('`').nth(1).filter(|t| t.starts_with("_dense")))
        .collect();
    assert_eq!(
        twins,
        ["_dense_nothr_flat", "_dense_flat", "_dense_nothr", "_dense"]
    );
    // Every general kernel (the size rules' too) has the two dense twins.
    let pairwise = s
        .variants
        .iter()
        .filter(|v| v.family == spec::Family::MergeAttnStates);
    let general = pairwise.filter(|v| v.role.twin_of.is_empty());
    let dense = format!("`_dense` ({} kernels)", general.count());
    assert!(list.contains(&dense), "{list}");
    assert!(list.contains("  3. else the kernel itself\n"), "{list}");
    assert!(
        list.ends_with("merge_states (1 kernel callers name):\n  1. the kernel named: no size rule, no specializations\n"),
        "{list}"
    );
}
