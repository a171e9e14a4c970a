//! One spec table from its lists to its kernels: `Lists::read` validates every list, `expand`
//! walks their cross product, `with_twins` sets FP8 outputs' heads per block and adds the tuned
//! size rule's and the dense kernels, and
//! `check_launch` fixes and checks each kernel's launch geometry. `super::parse` then keeps each
//! kernel name once.

use toml::Spanned;

use super::*;

/// Heads per block of FP8 outputs unless the spec sets it (`Lists::with_twins`).
const FP8_HEADS_PER_BLOCK: u32 = 8;

/// The kinds of twins `v` offers (`TWIN_KINDS` describes each): with the spec's `dense`, every
/// pairwise merge a dense one; with the threshold, those for calls where every token has
/// context; and the `_flat` ones for fewer heads where `takes_flat_twins`. Without the dense one,
/// none: the others build on it, and a kernel that offered them would have no twins while its
/// manifest entry said it had (`flat_twins`).
fn offered_twins(v: &MergeVariant, dense: bool) -> TwinSet {
    if !(dense && v.family == Family::MergeAttnStates) {
        return TwinSet::EMPTY;
    }
    let offers = |twin| match twin {
        Twin::Dense => true,
        Twin::AllContext => v.prefix_threshold,
        Twin::FewHeads => takes_flat_twins(v),
    };
    TWIN_KINDS
        .iter()
        .filter(|k| offers(k.twin))
        .fold(TwinSet::EMPTY, |set, k| set.with(k.twin))
}

/// Does this kernel get `_flat` dense twins (`Twin::FewHeads`)? Pairwise merges
/// without the fused mask, one row per thread, more than one head per block (every FP8 output:
/// they keep launch order and take FP8_HEADS_PER_BLOCK; the inputs' dtype where its tuned
/// schedule holds several heads). Below that many heads the block's slots of the missing heads
/// idle: bf16 d128 into FP8 at one head ran at 54% of copy with 8 heads per block and 99% with
/// flat rows (session 14), bf16 d96 at one head 73% and 92% (run 120); from 16 heads on, flat
/// rows were 3-10% slower in hot L2 at 1-20 MB (their lse reads scatter over more heads), so
/// they serve only the few-head calls their bounds allow (abi.rs, `few_heads`).
fn takes_flat_twins(v: &MergeVariant) -> bool {
    v.family == Family::MergeAttnStates
        && !v.mask_empty_context
        && v.schedule.rows_per_thread == 1
        && crate::gen::launch::BlockShape::of(v).heads_per_block > 1
}

/// One table's validated lists, in the order of the cross product (the order the keys are
/// documented), with what finishing its kernels needs.
pub(super) struct Lists<'t> {
    raw: &'t RawMerge,
    /// Where the table starts (its errors without a key of their own point here), and its line.
    pub(super) offset: usize,
    pub(super) line: usize,
    kinds: Vec<Family>,
    dtypes: Vec<Dtype>,
    heads: Vec<u32>,
    thresholds: Vec<bool>,
    ctx_masks: Vec<bool>,
    lses: Vec<bool>,
    outputs: Vec<(OutputKind, Option<Fp8Group>)>,
    layouts: Vec<LseLayout>,
    bases: Vec<LseBase>,
    /// rows_per_thread, min_blocks_per_sm, block_threads, heads_per_block, vecs_per_thread:
    /// `None` where the spec leaves the key out (each variant takes its tuned value).
    schedules: [Vec<Option<u32>>; 5],
    pdls: Vec<bool>,
    size_rule: bool,
    dense: bool,
}

impl<'t> Lists<'t> {
    /// Validate the table `spanned` of `table`'s family (its keys, then each list, in the order
    /// their errors are reported).
    pub(super) fn read(
        ctx: &Ctx,
        table: Family,
        spanned: &'t Spanned<RawMerge>,
    ) -> Result<Self, SpecError> {
        let offset = spanned.span().start;
        let f = spanned.get_ref();
        if let Some((key, v, why)) = f.foreign_keys(table) {
            return Err(ctx.at(
                v.span().start,
                format!("`{key}` is not a key of [[{}]]: {why}", table.table()),
            ));
        }
        let mask_lse = table == Family::MaskEmptyContextLse;
        // The lse mask has neither (its lse is float32; the keys were refused above).
        let (dtypes, heads) = if mask_lse {
            (vec![Dtype::F32], vec![1])
        } else {
            let dtypes = ctx.required(offset, "dtype", &f.dtype)?;
            let dtypes = ctx.list("dtype", dtypes, dtype)?;
            let heads = ctx.required(offset, "head_size", &f.head_size)?;
            (dtypes, ctx.list("head_size", heads, head_size)?)
        };
        let opt_list = |key: &str, v: &Option<Spanned<toml::Value>>, default: bool| match v {
            Some(v) => ctx.list(key, v, boolean),
            None => Ok(vec![default]),
        };
        // A K-way or in-place merge has no threshold (the keys were refused above).
        let pairwise = table == Family::MergeAttnStates;
        let thresholds = opt_list("prefix_threshold", &f.prefix_threshold, pairwise)?;
        let lses = opt_list("output_lse", &f.output_lse, !mask_lse)?;
        let ctx_masks = opt_list("mask_empty_context", &f.mask_empty_context, false)?;
        let pdls = opt_list("pdl", &f.pdl, false)?;
        let (size_rule, dense) = size_rule_and_dense(ctx, f)?;
        let outputs = output_choices(ctx, f, offset)?;
        let layouts = match &f.lse_layout {
            Some(v) => ctx.list("lse_layout", v, |x| one_of(&LseLayout::ALL, x))?,
            // merge_states' lse [T, K, H] is token-major by construction.
            None if matches!(table, Family::MergeStates { .. }) => vec![LseLayout::TokenMajor],
            None => vec![LseLayout::HeadMajor],
        };
        let bases = match &f.lse_base {
            Some(v) => ctx.list("lse_base", v, |x| one_of(&LseBase::ALL, x))?,
            None => vec![LseBase::E],
        };
        Ok(Lists {
            raw: f,
            offset,
            line: line_col(ctx.text, offset).0,
            kinds: kinds(ctx, table, f, offset)?,
            dtypes,
            heads,
            thresholds,
            ctx_masks,
            lses,
            outputs,
            layouts,
            bases,
            schedules: schedules(ctx, f)?,
            pdls,
            size_rule,
            dense,
        })
    }

    /// Where the first `pdl` that sets true is, to point a refusal of the archs at it.
    pub(super) fn pdl_at(&self) -> Option<usize> {
        let on = self.pdls.contains(&true);
        self.raw.pdl.as_ref().filter(|_| on).map(|v| v.span().start)
    }

    /// The length of each list, in the order of the cross product.
    fn lens(&self) -> [usize; 15] {
        let [rows, mins, blocks, head_groups, vec_groups] = &self.schedules;
        [
            self.kinds.len(),
            self.dtypes.len(),
            self.heads.len(),
            self.thresholds.len(),
            self.ctx_masks.len(),
            self.lses.len(),
            self.outputs.len(),
            self.layouts.len(),
            self.bases.len(),
            rows.len(),
            mins.len(),
            blocks.len(),
            head_groups.len(),
            vec_groups.len(),
            self.pdls.len(),
        ]
    }

    /// Refuse a table whose cross product would take the spec past `MAX_VARIANTS`, given the
    /// `so_far` kernels of the tables before it.
    pub(super) fn check_count(&self, ctx: &Ctx, so_far: usize) -> Result<(), SpecError> {
        if so_far.saturating_add(count(&self.lens())) > MAX_VARIANTS {
            return Err(ctx.at(
                self.offset,
                format!(
                    "the spec expands to more than {MAX_VARIANTS} kernels; split it or shorten its lists"
                ),
            ));
        }
        Ok(())
    }

    /// The cross product of the lists, the last list varying fastest.
    pub(super) fn expand(&self) -> impl Iterator<Item = MergeVariant> + '_ {
        product(self.lens()).map(move |[k, d, h, t, c, l, o, y, e, r, m, b, hb, vt, p]| {
            let (family, dtype, head_size) = (self.kinds[k], self.dtypes[d], self.heads[h]);
            let mask_empty_context = self.ctx_masks[c];
            let tuned = match family {
                Family::MergeStates { .. } => KWAY_SCHEDULE,
                Family::MaskEmptyContextLse => MASK_SCHEDULE,
                Family::MergeStateInPlace { .. } if self.layouts[y] == LseLayout::TokenMajor => {
                    TOKEN_MAJOR_IN_PLACE_SCHEDULE
                }
                _ => tuned_schedule(dtype, head_size),
            };
            let tuned = if mask_empty_context {
                fused_mask_schedule(tuned)
            } else {
                tuned
            };
            let [rows, mins, blocks, head_groups, vec_groups] = &self.schedules;
            let explicit = [rows[r], mins[m], blocks[b], head_groups[hb], vec_groups[vt]];
            let (output, fp8_group) = self.outputs[o];
            MergeVariant {
                family,
                dtype,
                head_size,
                prefix_threshold: self.thresholds[t],
                output_lse: self.lses[l],
                output,
                fp8_group,
                lse_layout: self.layouts[y],
                lse_base: self.bases[e],
                schedule: Schedule {
                    rows_per_thread: explicit[0].unwrap_or(tuned.rows_per_thread),
                    min_blocks_per_sm: explicit[1].unwrap_or(tuned.min_blocks_per_sm),
                    block_threads: explicit[2].unwrap_or(tuned.block_threads),
                    heads_per_block: explicit[3].unwrap_or(tuned.heads_per_block),
                    vecs_per_thread: explicit[4].unwrap_or(tuned.vecs_per_thread),
                },
                explicit_schedule: explicit.iter().any(Option::is_some),
                mask_empty_context,
                pdl: self.pdls[p],
                size_rule: Vec::new(),
                role: Role::default(),
            }
        })
    }

    /// The kernels one expanded variant becomes: with the tuned size rule, its main kernel takes
    /// the largest launches' schedule and each smaller range is a kernel of its own after it;
    /// then the dense specialization of every pairwise merge kernel, right after it.
    pub(super) fn with_twins(&self, mut v: MergeVariant) -> Vec<MergeVariant> {
        if v.output != OutputKind::Same && self.raw.heads_per_block.is_none() {
            // FP8 outputs keep launch order (no block renumbering: it costs them a division per
            // warp), so with one head per block the grid walked the tensors a head at a time,
            // one row in every H. With 8 adjacent heads per block the same kernels run at 95-100%
            // of copy instead of 89-97% (bf16 d128, 16K-32K tokens x 32-128 heads, run 109).
            // Launch halves it where a block has fewer rows. Set before the twins, which follow
            // it (calls with fewer heads take the `_flat` twins).
            v.schedule.heads_per_block = v.schedule.heads_per_block.max(FP8_HEADS_PER_BLOCK);
        }
        let kernels = if self.size_rule {
            v.with_tuned_size_rule()
        } else {
            vec![v]
        };
        // Each kernel of a size rule by its own schedule (its heads per block).
        let kernels = kernels
            .into_iter()
            .map(|mut k| {
                k.role.twins = offered_twins(&k, self.dense);
                k
            })
            .collect();
        MergeVariant::with_twins(kernels)
    }

    /// Launch geometry: the fused mask's occupancy, an FP8 group that fits the rows, and no more
    /// threads per SM than an SM has.
    pub(super) fn check_launch(
        &self,
        ctx: &Ctx,
        mut v: MergeVariant,
    ) -> Result<MergeVariant, SpecError> {
        // The threads a block really has (whole rows); min_blocks_per_sm does not change it.
        let block = crate::gen::launch::Launch::for_variant(&v).block_threads;
        let min_blocks_key = self.raw.min_blocks_per_sm.as_ref();
        let full_occupancy = (MAX_THREADS_PER_SM / block).max(1);
        if v.mask_empty_context && min_blocks_key.is_none() && v.dtype.size_bytes() <= 2 {
            // Full occupancy for the fused mask (variant.rs, fused_mask_schedule); float32
            // rows need more registers (d576 spilled at 32).
            v.schedule.min_blocks_per_sm = full_occupancy;
        }
        let float32_fused = v.mask_empty_context && v.dtype.size_bytes() > 2;
        if v.fp8_group.is_some() && min_blocks_key.is_none() && !float32_fused {
            // Full occupancy for group FP8 too: left to itself ptxas gives its dense twin 40
            // registers (3 blocks of 512 per SM), and at 32 it runs 1.05x faster with no spill
            // (bf16 d128, groups of 128, 16K-32K tokens: 83.6-88.6% -> 88.1-93.2% of copy,
            // docs/PERFORMANCE.md). Not float32 rows with the fused mask: at 32 registers they
            // spilled 4-24 bytes on sm_80 and sm_90 (NVRTC 13.0, the default spec's d64-d512).
            v.schedule.min_blocks_per_sm = full_occupancy;
        }
        if let Some(g) = v.fp8_group.filter(|g| !group_fits(&v, g.group_size)) {
            let offset = self.raw.group_size.as_ref();
            return Err(group_misfit(ctx, self.key_offset(offset), &v, g));
        }
        if block * v.schedule.min_blocks_per_sm > MAX_THREADS_PER_SM {
            return Err(ctx.at(
                self.key_offset(min_blocks_key),
                format!(
                    "`min_blocks_per_sm` = {} with {}-thread blocks ({} d{}) exceeds {MAX_THREADS_PER_SM} threads per SM; allowed here: 1..={}",
                    v.schedule.min_blocks_per_sm,
                    block,
                    v.dtype.name(),
                    v.head_size,
                    MAX_THREADS_PER_SM / block
                ),
            ));
        }
        Ok(v)
    }

    /// Where a key's value starts, or the table when the key is absent.
    fn key_offset(&self, key: Option<&Spanned<toml::Value>>) -> usize {
        key.map_or(self.offset, |s| s.span().start)
    }
}

/// The product of list lengths, saturating: a spec of many long lists must get the count's
/// error, not an overflow.
fn count(lens: &[usize]) -> usize {
    lens.iter().fold(1usize, |acc, &n| acc.saturating_mul(n))
}

/// Every index tuple into lists of lengths `lens`, the last index varying fastest (the order of
/// nested loops over the lists, the first outermost).
fn product<const N: usize>(lens: [usize; N]) -> impl Iterator<Item = [usize; N]> {
    (0..count(&lens)).map(move |mut i| {
        let mut at = [0; N];
        for (slot, &len) in at.iter_mut().zip(&lens).rev() {
            *slot = i % len;
            i /= len;
        }
        at
    })
}

/// `size_rule` and `dense` (both default true); a table that sets its own schedule may not ask
/// for the size rule's.
fn size_rule_and_dense(ctx: &Ctx, f: &RawMerge) -> Result<(bool, bool), SpecError> {
    let flag = |key: &str, v: &Option<Spanned<toml::Value>>| match v {
        Some(v) => {
            boolean(v.get_ref()).map_err(|why| ctx.at(v.span().start, format!("`{key}`: {why}")))
        }
        None => Ok(true),
    };
    let size_rule = flag("size_rule", &f.size_rule)?;
    let dense = flag("dense", &f.dense)?;
    let schedule_key = [
        &f.rows_per_thread,
        &f.min_blocks_per_sm,
        &f.block_threads,
        &f.heads_per_block,
        &f.vecs_per_thread,
    ]
    .into_iter()
    .flatten()
    .next();
    if let (Some(v), true, Some(_)) = (&f.size_rule, size_rule, schedule_key) {
        return Err(ctx.at(
            v.span().start,
            "`size_rule` = true picks among the tuned schedules, and this table sets its own schedule: remove `size_rule` or the schedule keys".to_string(),
        ));
    }
    Ok((size_rule, dense))
}

/// Each output kind with its group parameters: group_size and ue8m0 apply to fp8_e4m3_group
/// only, which needs group_size.
fn output_choices(
    ctx: &Ctx,
    f: &RawMerge,
    table_offset: usize,
) -> Result<Vec<(OutputKind, Option<Fp8Group>)>, SpecError> {
    let outputs = match &f.output {
        Some(v) => ctx.list("output", v, |x| one_of(&OutputKind::ALL, x))?,
        None => vec![OutputKind::Same],
    };
    let grouped = outputs.contains(&OutputKind::Fp8E4m3Group);
    let only_grouped = |key: &str, v: &Spanned<toml::Value>| {
        ctx.at(
            v.span().start,
            format!("`{key}` applies only with output = \"fp8_e4m3_group\""),
        )
    };
    let group_sizes = match (&f.group_size, grouped) {
        (Some(v), true) => ctx.list("group_size", v, |x| {
            match x.as_integer().and_then(|n| u32::try_from(n).ok()) {
                Some(n) if GROUP_SIZES_ALLOWED.contains(&n) => Ok(n),
                _ => Err(format!(
                    "{} is not allowed; allowed: 16, 32, 64, 128",
                    short(x)
                )),
            }
        })?,
        (None, true) => {
            return Err(ctx.at(
                table_offset,
                "output = \"fp8_e4m3_group\" needs `group_size` (16, 32, 64 or 128)".to_string(),
            ))
        }
        (Some(v), false) => return Err(only_grouped("group_size", v)),
        (None, false) => Vec::new(),
    };
    let ue8m0s = match (&f.ue8m0, grouped) {
        (Some(v), true) => ctx.list("ue8m0", v, boolean)?,
        (Some(v), false) => return Err(only_grouped("ue8m0", v)),
        (None, _) => vec![false],
    };
    let groups = |o: OutputKind| -> Vec<(OutputKind, Option<Fp8Group>)> {
        if o != OutputKind::Fp8E4m3Group {
            return vec![(o, None)];
        }
        product([group_sizes.len(), ue8m0s.len()])
            .map(|[g, u]| {
                let group = Fp8Group {
                    group_size: group_sizes[g],
                    ue8m0: ue8m0s[u],
                };
                (o, Some(group))
            })
            .collect()
    };
    Ok(outputs.into_iter().flat_map(groups).collect())
}

/// The families a table's kernels have: K values of a K-way table, masks of an in-place one.
fn kinds(
    ctx: &Ctx,
    table: Family,
    f: &RawMerge,
    table_offset: usize,
) -> Result<Vec<Family>, SpecError> {
    Ok(match table {
        Family::MergeStates { .. } => {
            let v = ctx.required(table_offset, "num_states", &f.num_states)?;
            ctx.list("num_states", v, num_states)?
                .into_iter()
                .map(|num_states| Family::MergeStates { num_states })
                .collect()
        }
        Family::MergeStateInPlace { .. } => match &f.mask {
            Some(v) => ctx
                .list("mask", v, boolean)?
                .into_iter()
                .map(|mask| Family::MergeStateInPlace { mask })
                .collect(),
            None => vec![Family::MergeStateInPlace { mask: false }],
        },
        other => vec![other],
    })
}

/// The schedule keys' choices, in the order of `Lists::schedules`.
fn schedules(ctx: &Ctx, f: &RawMerge) -> Result<[Vec<Option<u32>>; 5], SpecError> {
    Ok([
        ctx.schedule_choices("rows_per_thread", &f.rows_per_thread, "1, 2, 4, 8", |n| {
            ROWS_PER_THREAD_ALLOWED.contains(&n)
        })?,
        ctx.schedule_choices("min_blocks_per_sm", &f.min_blocks_per_sm, "1..=32", |n| {
            (1..=32).contains(&n)
        })?,
        ctx.schedule_choices(
            "block_threads",
            &f.block_threads,
            "128, 256, 512, 1024",
            |n| BLOCK_THREADS_ALLOWED.contains(&n),
        )?,
        ctx.schedule_choices(
            "heads_per_block",
            &f.heads_per_block,
            "1, 2, 4, 8, 16, 32",
            |n| HEADS_PER_BLOCK_ALLOWED.contains(&n),
        )?,
        ctx.schedule_choices("vecs_per_thread", &f.vecs_per_thread, "1, 2, 4", |n| {
            VECS_PER_THREAD_ALLOWED.contains(&n)
        })?,
    ])
}

/// The refusal of an FP8 group size that does not fit `v`'s rows, with the sizes that would.
fn group_misfit(ctx: &Ctx, offset: usize, v: &MergeVariant, g: Fp8Group) -> SpecError {
    let fits: Vec<String> = GROUP_SIZES_ALLOWED
        .iter()
        .filter(|&&n| group_fits(v, n))
        .map(|n| n.to_string())
        .collect();
    ctx.at(
        offset,
        format!(
            "`group_size` = {} does not fit {} d{}: a group must divide the head size and its lanes one warp; allowed here: {}",
            g.group_size,
            v.dtype.name(),
            v.head_size,
            if fits.is_empty() { "none".to_string() } else { fits.join(", ") }
        ),
    )
}
