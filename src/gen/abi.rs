//! What a kernel takes and how it is launched, derived from its variant. This is the single
//! description of the kernel ABI: the template renders the signature from `params`, the manifest
//! records it, and the runtime and bindings launch by it.

use std::collections::BTreeMap;

use crate::contract::{Bounds, Dim, LaunchRule, Limit, Tensor};
pub use crate::contract::{Contract, Param, ParamKind, Role};
use crate::dtype::Dtype;
pub use crate::gen::launch::{Launch, GRID_RULE, MAX_GRID_Y, MAX_THREADS_PER_ROW, MAX_VEC_BYTES};
use crate::gen::variant::{Family, LseBase, LseLayout, MergeVariant, OutputKind, Twin};

/// A kernel's parameters in signature order, each with what a caller must satisfy.
pub fn params(v: &MergeVariant) -> Vec<Param> {
    contract(v).params
}

/// The whole argument contract of a kernel: parameters, constants and launch rule.
pub fn contract(v: &MergeVariant) -> Contract {
    let launch = Launch::for_variant(v);
    let b = Build { v, l: &launch };
    let mut constants = BTreeMap::new();
    let params = match v.family {
        Family::MergeAttnStates => b.pairwise(&mut constants),
        Family::MergeStates { num_states } => b.k_way(num_states, &mut constants),
        Family::MergeStateInPlace { mask } => b.in_place(mask, &mut constants),
        Family::MaskEmptyContextLse => b.mask_lse(),
    };
    // A specialization's contract is its general kernel's with each of its kinds' constraints.
    let mut limits = Vec::new();
    let params = v.role.twin_of.kinds().fold(params, |params, kind| {
        constrain(kind.twin, params, &mut limits, v, &launch)
    });
    Contract {
        params,
        constants,
        limits,
        launch: LaunchRule {
            block_threads: launch.block_threads,
            shared_mem_bytes: launch.shared_mem_bytes,
            grid_x: launch.grid_x,
            grid_y: launch.grid_y,
            pdl: launch.pdl,
            size_rule: launch.size_rule,
            specializations: launch.specializations,
        },
        select: select(v),
    }
}

/// What selects the kernel that its parameters cannot say: the lse layout (`[H, T]` and
/// `[T, H]` differ only in which size is which, so a call with T = H fits both, and the layout
/// is never guessed from shapes), UE8M0 scales (the same parameters either way) and the lse's
/// base.
fn select(v: &MergeVariant) -> BTreeMap<String, String> {
    let mut s = BTreeMap::new();
    if !matches!(v.family, Family::MergeStates { .. }) {
        s.insert("lse_layout".into(), v.lse_layout.name().into());
    }
    if let Some(g) = v.fp8_group {
        s.insert("ue8m0".into(), g.ue8m0.to_string());
    }
    // Base 2 only: a call in base e states no lse_base, and options match both ways.
    if v.lse_base == LseBase::Two {
        s.insert("lse_base".into(), "2".into());
    }
    s
}

/// The bounds a specialization of kind `twin` adds to `params` (and to `limits`): the calls it
/// takes, as `TWIN_KINDS` describes them.
fn constrain(
    twin: Twin,
    params: Vec<Param>,
    limits: &mut Vec<Limit>,
    v: &MergeVariant,
    launch: &Launch,
) -> Vec<Param> {
    match twin {
        // It reads its tensors without padding, rows numbered in 32 bits.
        Twin::Dense => {
            limits.push(Limit {
                expr: "num_tokens*num_heads".into(),
                max: i32::MAX as u64,
                why: "this kernel numbers rows (tokens x heads) in 32 bits".into(),
            });
            dense_strides(params, v.head_size)
        }
        Twin::AllContext => all_context(params),
        Twin::FewHeads => few_heads(params, v, launch),
    }
}

/// The threshold of a specialization for calls where every token has context: n = T only.
fn all_context(mut params: Vec<Param>) -> Vec<Param> {
    for p in params.iter_mut().filter(|p| p.name == THRESHOLD) {
        if let Some(bounds) = p.bounds.as_mut() {
            bounds.min = "num_tokens".into();
        }
        p.doc = "n = T: every token has context (this specialization takes no other value)".into();
    }
    params
}

/// The pairwise merge's threshold: the tokens with context come first.
const THRESHOLD: &str = "prefill_tokens_with_context";

/// The calls a flat-row specialization (`_flat`) serves, in its bounds; its other bounds stay.
/// FP8 outputs: fewer heads than a block of the general kernel holds (54% -> 99% of copy at one
/// head of 8, run 112-113). The inputs' dtype: at most half as many, and at least
/// `FLAT_MIN_BLOCKS` blocks' tokens: with 3 heads of 4, or a flat grid of fewer blocks than the
/// GPU has SMs (<= 4096 rows at D = 64), flat rows were 2-12% slower in hot L2; within both
/// bounds 0.99-1.43x the speed of the blocks (runs 120-121, docs/HISTORY.md, session 15).
fn few_heads(mut params: Vec<Param>, v: &MergeVariant, launch: &Launch) -> Vec<Param> {
    let held = launch.heads_per_block;
    let (most_heads, fewest_tokens) = if v.output == OutputKind::Same {
        let rows_per_block = launch.tokens_per_block * held;
        (held / 2, Some(FLAT_MIN_BLOCKS * rows_per_block))
    } else {
        (held - 1, None)
    };
    // sizes() gives both their bounds (the spec tests check these land).
    for p in params.iter_mut() {
        let Some(bounds) = p.bounds.as_mut() else {
            continue;
        };
        if p.name == "num_heads" {
            bounds.max = Some(most_heads.to_string());
            let which = if most_heads + 1 == held {
                format!("fewer than {held}")
            } else {
                format!("at most {most_heads}")
            };
            p.doc = format!(
                "{} ({which}: the blocks of the general kernel hold {held} heads)",
                p.doc
            );
        } else if let (Some(fewest), "num_tokens") = (fewest_tokens, p.name.as_str()) {
            bounds.min = fewest.to_string();
            p.doc = format!(
                "{} (at least {fewest}: a grid of {FLAT_MIN_BLOCKS} blocks or more)",
                p.doc
            );
        }
    }
    params
}

/// The fewest blocks a flat-row kernel of the inputs' dtype launches at one head (its
/// `num_tokens` bound): about one per SM of an H100 or H200 (132).
const FLAT_MIN_BLOCKS: u32 = 128;

/// The stride parameters of a dense kernel's `[T, H, D]` tensors bound to the dense strides:
/// token stride H x D, head stride D (the kernel does not read them).
fn dense_strides(mut params: Vec<Param>, head_size: u32) -> Vec<Param> {
    for p in &mut params {
        let dense = if p.name.ends_with("_token_stride") && !p.name.starts_with("scale_") {
            format!("num_heads*{head_size}")
        } else if p.name.ends_with("_head_stride") {
            head_size.to_string()
        } else {
            continue;
        };
        p.bounds = Some(Bounds {
            min: dense.clone(),
            max: Some(dense),
            default: None,
        });
        p.doc = format!("{} (dense: this value only)", p.doc);
    }
    params
}

/// Builds one variant's parameters; each family below reads as its signature.
struct Build<'a> {
    v: &'a MergeVariant,
    l: &'a Launch,
}

fn dim(label: &str, size: impl Into<String>, stride: impl Into<String>) -> Dim {
    Dim {
        label: label.into(),
        size: size.into(),
        stride: stride.into(),
    }
}

fn c_pointer(elem: &str, role: Role) -> String {
    match role {
        Role::Read => format!("const {elem}* __restrict__"),
        Role::Write => format!("{elem}* __restrict__"),
        // The same thread reads each element before it writes it: no __restrict__ promise.
        Role::ReadWrite | Role::Value => format!("{elem}*"),
    }
}

impl Build<'_> {
    /// A pointer to `elem` values covering `dims`.
    fn pointer(
        &self,
        name: &str,
        elem: Dtype,
        role: Role,
        dims: Vec<Dim>,
        align_bytes: u32,
        doc: &str,
    ) -> Param {
        // Strides the caller chooses must keep every vector access aligned.
        let stride_multiple = if align_bytes > elem.size_bytes() {
            self.l.vec_elems
        } else {
            1
        };
        Param {
            name: name.into(),
            c_type: c_pointer(elem.info().c_type, role),
            kind: ParamKind::Pointer,
            role,
            elem: Some(elem.name().into()),
            elem_bytes: elem.size_bytes(),
            nullable: false,
            tensor: Some(Tensor {
                dims,
                align_bytes,
                stride_multiple,
                distinct: role.writes(),
            }),
            bounds: None,
            doc: doc.into(),
        }
    }

    /// Rows `[T, H, D]` of `name` with its own token and head strides.
    fn rows(&self, name: &str, strides: &str, elem: Dtype, role: Role, doc: &str) -> Param {
        let align = if elem == self.v.dtype {
            self.l.vec_bytes
        } else {
            self.l.out_vec_bytes
        };
        let dims = vec![
            dim("T", "num_tokens", format!("{strides}_token_stride")),
            dim("H", "num_heads", format!("{strides}_head_stride")),
            dim("D", "head_size", "1"),
        ];
        self.pointer(name, elem, role, dims, align, doc)
    }

    /// A float32 lse `[T, H]` in the variant's layout.
    fn lse(&self, name: &str, role: Role, doc: &str) -> Param {
        let dims = match self.v.lse_layout {
            LseLayout::HeadMajor => vec![
                dim("H", "num_heads", "num_tokens"),
                dim("T", "num_tokens", "1"),
            ],
            LseLayout::TokenMajor => vec![
                dim("T", "num_tokens", "num_heads"),
                dim("H", "num_heads", "1"),
            ],
        };
        self.pointer(name, Dtype::F32, role, dims, 4, doc)
    }

    fn pairwise(&self, constants: &mut BTreeMap<String, String>) -> Vec<Param> {
        let v = self.v;
        constants.insert("head_size".into(), v.head_size.to_string());
        let out = v.output.dtype(v.dtype);
        let mut p = vec![self.rows(
            "output",
            "output",
            out,
            Role::Write,
            "[T, H, D] merged output",
        )];
        if v.output_lse {
            p.push(nullable(self.lse(
                "output_lse",
                Role::Write,
                "merged log-sum-exp, same layout as the inputs' lse; null = not written",
            )));
        }
        p.extend([
            self.rows(
                "prefix_output",
                "prefix",
                v.dtype,
                Role::Read,
                "[T, H, D] prefix partial output",
            ),
            self.lse("prefix_lse", Role::Read, "float32 lse of the prefix"),
            self.rows(
                "suffix_output",
                "suffix",
                v.dtype,
                Role::Read,
                "[T, H, D] suffix partial output",
            ),
            self.lse("suffix_lse", Role::Read, "float32 lse of the suffix"),
        ]);
        if v.output == OutputKind::Fp8E4m3 {
            p.push(self.pointer(
                "output_scale",
                Dtype::F32,
                Role::Read,
                Vec::new(),
                4,
                "one float32: out = saturate(value / scale) in e4m3",
            ));
        }
        if let Some(g) = v.fp8_group {
            let groups = format!("num_heads*{}", v.head_size / g.group_size);
            p.push(self.pointer(
                "output_scales",
                Dtype::F32,
                Role::Write,
                vec![
                    dim("T", "num_tokens", "scale_token_stride"),
                    dim("G", groups, "scale_group_stride"),
                ],
                4,
                "one float32 per group, (t, h*D/G + g) at t*scale_token_stride + (h*D/G + g)*scale_group_stride",
            ));
        }
        if v.mask_empty_context {
            p.extend(self.start_locations());
        }
        p.extend(sizes());
        p.extend(strides("output", "output"));
        p.extend(strides("prefix", "prefix_output"));
        p.extend(strides("suffix", "suffix_output"));
        if v.fp8_group.is_some() {
            p.push(stride(
                "scale_token_stride",
                "elements between tokens of output_scales",
            ));
            p.push(stride(
                "scale_group_stride",
                "elements between groups of output_scales",
            ));
        }
        if v.prefix_threshold {
            p.push(int(
                THRESHOLD,
                "0",
                Some("num_tokens"),
                Some("num_tokens"),
                "n in 0..=T: tokens t >= n copy the suffix (no context)",
            ));
        } else {
            // Built without the threshold: every token has context.
            constants.insert(THRESHOLD.into(), "num_tokens".into());
        }
        if v.mask_empty_context {
            p.push(num_requests());
        }
        p
    }

    fn k_way(
        &self,
        num_states: Option<u32>,
        constants: &mut BTreeMap<String, String>,
    ) -> Vec<Param> {
        let v = self.v;
        constants.insert("head_size".into(), v.head_size.to_string());
        let k = match num_states {
            Some(k) => {
                constants.insert("num_states".into(), k.to_string());
                k.to_string()
            }
            None => "num_states".to_string(),
        };
        let mut p = vec![self.rows(
            "output",
            "output",
            v.dtype,
            Role::Write,
            "[T, H, D] merged output",
        )];
        if v.output_lse {
            p.push(nullable(self.pointer(
                "output_lse",
                Dtype::F32,
                Role::Write,
                vec![
                    dim("T", "num_tokens", "num_heads"),
                    dim("H", "num_heads", "1"),
                ],
                4,
                "[T, H] float32 merged log-sum-exp, dense; null = not written",
            )));
        }
        p.push(self.pointer(
            "states",
            v.dtype,
            Role::Read,
            vec![
                dim("T", "num_tokens", "states_token_stride"),
                dim("K", k.clone(), "states_state_stride"),
                dim("H", "num_heads", "states_head_stride"),
                dim("D", "head_size", "1"),
            ],
            self.l.vec_bytes,
            "[T, K, H, D] partial outputs",
        ));
        p.push(self.pointer(
            "states_lse",
            Dtype::F32,
            Role::Read,
            vec![
                dim("T", "num_tokens", format!("{k}*num_heads")),
                dim("K", k.clone(), "num_heads"),
                dim("H", "num_heads", "1"),
            ],
            4,
            "[T, K, H] float32, dense",
        ));
        if num_states.is_none() {
            p.push(int(
                "num_states",
                "1",
                None,
                None,
                "K >= 1: states per token",
            ));
        }
        p.extend(sizes());
        p.extend(strides("output", "output"));
        p.push(stride(
            "states_token_stride",
            "elements between tokens of states",
        ));
        p.push(stride(
            "states_state_stride",
            "elements between the K states of a token",
        ));
        p.push(stride(
            "states_head_stride",
            "elements between heads of states",
        ));
        p
    }

    fn in_place(&self, mask: bool, constants: &mut BTreeMap<String, String>) -> Vec<Param> {
        let v = self.v;
        constants.insert("head_size".into(), v.head_size.to_string());
        let mut p = vec![
            self.rows(
                "state",
                "state",
                v.dtype,
                Role::ReadWrite,
                "[T, H, D] read, then overwritten with merge(state, other)",
            ),
            self.lse(
                "state_lse",
                Role::ReadWrite,
                "the state's lse, read, then overwritten with the merged lse",
            ),
            self.rows(
                "other",
                "other",
                v.dtype,
                Role::Read,
                "[T, H, D] the state merged in",
            ),
            self.lse("other_lse", Role::Read, "float32 lse of other"),
        ];
        if mask {
            p.push(nullable(self.pointer(
                "mask",
                Dtype::U8,
                Role::Read,
                vec![dim("T", "num_tokens", "1")],
                1,
                "[T] bytes: tokens whose byte is 0 are left untouched; null = merge every token",
            )));
        }
        p.extend(sizes());
        p.extend(strides("state", "state"));
        p.extend(strides("other", "other"));
        p
    }

    fn mask_lse(&self) -> Vec<Param> {
        let mut p = vec![self.lse(
            "lse",
            Role::Write,
            "float32 lse, set to -inf in place for the tokens of requests with an empty context",
        )];
        p.extend(self.start_locations());
        p.push(num_requests());
        p.extend(sizes());
        p
    }

    /// The requests' query and context start locations (the empty-context mask's inputs).
    fn start_locations(&self) -> [Param; 2] {
        let starts = |name: &str, doc: &str| {
            self.pointer(
                name,
                Dtype::I32,
                Role::Read,
                vec![dim("B+1", "num_requests+1", "1")],
                4,
                doc,
            )
        };
        [
            starts(
                "query_start_loc",
                "[B + 1] int32: the tokens of request b are query_start_loc[b] .. query_start_loc[b+1]",
            ),
            starts(
                "context_start_loc",
                "[B + 1] int32: request b's context is empty when context_start_loc[b+1] == context_start_loc[b]",
            ),
        ]
    }
}

/// B, the number of requests; B + 1 start locations must be indexable by int32.
fn num_requests() -> Param {
    int("num_requests", "0", Some("2147483646"), None, "B")
}

fn nullable(mut p: Param) -> Param {
    p.nullable = true;
    p
}

fn int(name: &str, min: &str, max: Option<&str>, default: Option<&str>, doc: &str) -> Param {
    Param {
        name: name.into(),
        c_type: "long long".into(),
        kind: ParamKind::I64,
        role: Role::Value,
        elem: None,
        elem_bytes: 0,
        nullable: false,
        tensor: None,
        bounds: Some(Bounds {
            min: min.into(),
            max: max.map(Into::into),
            default: default.map(Into::into),
        }),
        doc: doc.into(),
    }
}

fn stride(name: &str, doc: &str) -> Param {
    int(name, "0", None, None, doc)
}

fn sizes() -> [Param; 2] {
    [
        int("num_tokens", "0", None, None, "T"),
        int("num_heads", "0", None, None, "H"),
    ]
}

/// The token and head strides of a `[T, H, D]` tensor (`prefix` -> `prefix_token_stride`).
fn strides(prefix: &str, tensor: &str) -> [Param; 2] {
    [
        stride(
            &format!("{prefix}_token_stride"),
            &format!("elements between tokens of {tensor}"),
        ),
        stride(
            &format!("{prefix}_head_stride"),
            &format!("elements between heads of {tensor} (>= D)"),
        ),
    ]
}

#[cfg(test)]
mod tests;
