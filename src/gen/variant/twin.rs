//! A kernel's role among the kernels one call may run, as data. A caller names a general
//! kernel; its size rule may send the launch to a range kernel (`_below<rows>`), and then
//! hosts launch the first of that kernel's specializations ("twins") whose contract accepts
//! the call (docs/MANIFEST.md, "Size rules" and "Specializations"). Each kind of twin is one
//! row of [`TWIN_KINDS`]: its name tag, its manifest keys and their meaning, and its place in
//! the order hosts try twins. The rest follows from the kind: abi.rs `constrain` turns it into
//! contract bounds, spec/expand.rs `offered_twins` says which kernels get it, and the twins,
//! their names and their order come from here ([`Role`]).

use serde::ser::{Serialize, SerializeMap, Serializer};

/// A kind of specialization: the constraint it adds to its general kernel's contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Twin {
    /// The `[T, H, D]` tensors have no padding: one row number addresses all three.
    Dense,
    /// Every token has context: the threshold is `num_tokens`, so the kernel tests none.
    AllContext,
    /// Fewer heads than a block of the general kernel holds: rows numbered `t * H + h`.
    FewHeads,
}

/// One kind of specialization, described once.
pub struct TwinKind {
    pub twin: Twin,
    /// Its tag in a twin's name, after its general kernel's name; tags follow this table's order.
    pub tag: &'static str,
    /// The manifest's variant key that is true on twins of this kind, and what it says.
    pub key: &'static str,
    pub key_doc: &'static str,
    /// The key that is true on general kernels with twins of this kind, and what it says; none
    /// where the kernel's other options imply them.
    pub has_key: Option<(&'static str, &'static str)>,
    /// Hosts try a twin of this kind before any twin without it that ties on the kinds of
    /// higher priority (see [`Role::twin_sets`]).
    pub priority: u32,
    /// Every twin is of this kind (the other kinds build on it); without it offered, a kernel
    /// has no twins.
    pub base: bool,
    /// The calls a twin of this kind takes, for the decision list.
    pub takes: &'static str,
}

/// Every kind of specialization, in the order of their tags in a name (and of `Twin`).
pub const TWIN_KINDS: [TwinKind; 3] = [
    TwinKind {
        twin: Twin::Dense,
        tag: "_dense",
        key: "dense",
        key_doc: "The dense specialization of a pairwise merge (`_dense`): its `[T, H, D]` tensors have no\npadding, which its contract requires, so one row number addresses all three. Hosts launch\nit in place of the general kernel when its contract accepts the call (docs/MANIFEST.md,\n\"Specializations\").",
        has_key: Some((
            "dense_specialization",
            "This kernel has a dense specialization (spec key `dense`, default true for pairwise\nmerges), listed in its launch's `specializations`.",
        )),
        priority: 0,
        base: true,
        takes: "tensors without padding (every stride the dense one), rows (tokens x heads) below 2^31",
    },
    TwinKind {
        twin: Twin::AllContext,
        tag: "_nothr",
        key: "all_context",
        key_doc: "A dense specialization for calls where every token has context (`_dense_nothr`): its\ncontract bounds the threshold to `num_tokens`, so the kernel has no threshold to test.\nHosts try it before the plain `_dense` twin.",
        // Every kernel with the threshold and a dense twin has these.
        has_key: None,
        priority: 1,
        base: false,
        takes: "every token has context (prefill_tokens_with_context = num_tokens)",
    },
    TwinKind {
        twin: Twin::FewHeads,
        tag: "_flat",
        key: "flat_rows",
        key_doc: "A dense specialization for calls with fewer heads than the general kernel's block holds\n(`_flat`): its contract bounds `num_heads` below that (and, for outputs of the inputs'\ndtype, `num_tokens` from below: abi.rs `few_heads`), and it numbers rows `t * H + h`,\neach block taking the next ones, so no thread of a block idles for want of a head.\nHosts try these first.",
        has_key: Some((
            "flat_twins",
            "This kernel has `_flat` dense twins, listed first in its specializations (set by the spec\nlayer: pairwise merges without the fused mask whose blocks hold several heads, see\n`flat_rows`).",
        )),
        priority: 2,
        base: false,
        takes: "fewer heads than a block of the general kernel holds (outputs of the inputs' dtype: at most half as many, and enough tokens for 128 blocks)",
    },
];

/// The manifest key of a range kernel's bound, and what it says (the schema's text).
#[cfg(feature = "schema")]
const ROWS_BELOW_DOC: &str = "A kernel of another's size rule: it serves that kernel's launches with fewer rows\n(tokens x heads) than this, and is named after it with `_below<rows>` (before `_pdl`).";

/// A set of kinds of specialization (a bit per row of [`TWIN_KINDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TwinSet(u8);

impl TwinSet {
    pub const EMPTY: TwinSet = TwinSet(0);

    /// A kind's bit: its row in TWIN_KINDS (the table lists the kinds in declaration order).
    fn bit(twin: Twin) -> u8 {
        1 << twin as u8
    }

    pub fn of(twins: &[Twin]) -> TwinSet {
        TwinSet(twins.iter().fold(0, |set, &t| set | Self::bit(t)))
    }

    pub fn contains(self, twin: Twin) -> bool {
        self.0 & Self::bit(twin) != 0
    }

    pub fn with(self, twin: Twin) -> TwinSet {
        TwinSet(self.0 | Self::bit(twin))
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Its kinds, in table order.
    pub fn kinds(self) -> impl Iterator<Item = &'static TwinKind> {
        TWIN_KINDS.iter().filter(move |k| self.contains(k.twin))
    }

    /// Hosts try the twin of the higher rank first: a kind outranks every combination of kinds
    /// of lower priority, so a twin always comes before those with a subset of its constraints.
    fn rank(self) -> u32 {
        self.kinds().map(|k| 1 << k.priority).sum()
    }

    /// Its tags, in table order (`_dense_nothr`).
    pub fn tags(self) -> String {
        self.kinds().map(|k| k.tag).collect()
    }
}

/// Where a kernel stands among the kernels one call may run: the general kernel a caller names
/// (the default), a range of its size rule, a specialization, or a specialization of a range.
/// The manifest writes it as the keys of [`TWIN_KINDS`] and `rows_below`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Role {
    /// A range kernel of another's size rule: it serves its launches with fewer rows
    /// (tokens x heads) than this.
    pub rows_below: Option<u64>,
    /// The kinds this kernel is a specialization of, each adding its constraint; empty: none.
    pub twin_of: TwinSet,
    /// The kinds of twins this kernel offers; its twins are their combinations ([`Role::twin_sets`]).
    pub twins: TwinSet,
}

impl Role {
    /// A general kernel that offers twins of `kinds`.
    pub fn offering(kinds: &[Twin]) -> Role {
        Role {
            twins: TwinSet::of(kinds),
            ..Role::default()
        }
    }

    /// A kernel callers name: neither a range kernel nor a twin.
    pub fn is_named(&self) -> bool {
        self.rows_below.is_none() && self.twin_of.is_empty()
    }

    /// Each twin's kinds, in the order hosts try them: every combination of the offered kinds
    /// that has the base ones, by descending rank (`_dense_nothr_flat`, `_dense_flat`,
    /// `_dense_nothr`, `_dense`).
    pub fn twin_sets(&self) -> Vec<TwinSet> {
        let base = TWIN_KINDS.iter().filter(|k| k.base);
        if base.clone().any(|k| !self.twins.contains(k.twin)) {
            return Vec::new();
        }
        let base = base.fold(TwinSet::EMPTY, |set, k| set.with(k.twin));
        let mut sets: Vec<TwinSet> = (0..=self.twins.0)
            .filter(|bits| bits & !self.twins.0 == 0 && bits & base.0 == base.0)
            .map(TwinSet)
            .collect();
        sets.sort_by_key(|set| std::cmp::Reverse(set.rank()));
        sets
    }

    /// Its part of a kernel name: `_below<rows>`, then the twin tags.
    pub fn name_suffix(&self) -> String {
        let below = self.rows_below.map(|rows| format!("_below{rows}"));
        below.unwrap_or_default() + &self.twin_of.tags()
    }
}

/// The manifest's keys: `rows_below`, then each kind's key(s) in table order, true ones only.
impl Serialize for Role {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        if let Some(rows) = self.rows_below {
            map.serialize_entry("rows_below", &rows)?;
        }
        for kind in &TWIN_KINDS {
            if self.twin_of.contains(kind.twin) {
                map.serialize_entry(kind.key, &true)?;
            }
            if let (Some((key, _)), true) = (kind.has_key, self.twins.contains(kind.twin)) {
                map.serialize_entry(key, &true)?;
            }
        }
        map.end()
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Role {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Role".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let flag = |doc: &str| serde_json::json!({ "description": doc, "type": "boolean" });
        let mut properties = serde_json::Map::new();
        properties.insert(
            "rows_below".into(),
            serde_json::json!({
                "description": ROWS_BELOW_DOC,
                "type": ["integer", "null"],
                "format": "uint64",
                "minimum": 0
            }),
        );
        for kind in &TWIN_KINDS {
            properties.insert(kind.key.into(), flag(kind.key_doc));
            if let Some((key, doc)) = kind.has_key {
                properties.insert(key.into(), flag(doc));
            }
        }
        schemars::json_schema!({ "type": "object", "properties": properties })
    }
}

/// What hosts try for a call, in order, for each family among `kernels` (a spec's): the size
/// rule's ranges, then the specializations, then the kernel named; one readable block per
/// family, with how many of its kernels have each step. Built from [`TWIN_KINDS`], so it says
/// what the manifest's `size_rule` and `specializations` do.
pub fn decision_list(kernels: &[super::MergeVariant]) -> String {
    let mut families: Vec<&'static str> = kernels.iter().map(|k| k.family.table()).collect();
    families.dedup();
    let mut out = String::new();
    for family in families {
        let of_family = kernels.iter().filter(|k| k.family.table() == family);
        // Range kernels are general kernels of their own: they have twins too.
        let general: Vec<_> = of_family.filter(|k| k.role.twin_of.is_empty()).collect();
        let named = general.iter().filter(|k| k.role.is_named()).count();
        let with_rule = general.iter().filter(|k| !k.size_rule.is_empty()).count();
        let mut sets: Vec<TwinSet> = general.iter().flat_map(|k| k.role.twin_sets()).collect();
        sets.sort_by_key(|set| (std::cmp::Reverse(set.rank()), set.0));
        sets.dedup();
        out += &format!("{family} ({} callers name):\n", kernels_count(named));
        let mut step = 1;
        if with_rule > 0 {
            out += &format!(
                "  {step}. size rule ({}): rows = num_tokens x num_heads; the first range, by ascending bound, whose bound the rows are below runs its `_below<rows>` kernel, larger launches the kernel named\n",
                kernels_count(with_rule)
            );
            step += 1;
        }
        if !sets.is_empty() {
            out += &format!(
                "  {step}. the first specialization of that kernel whose contract accepts the call (its launch's `specializations`):\n"
            );
            for (letter, set) in ('a'..).zip(&sets) {
                let having = general.iter().filter(|k| k.role.twin_sets().contains(set));
                let takes: Vec<&str> = set.kinds().map(|k| k.takes).collect();
                out += &format!(
                    "     {letter}. `{}` ({}): {}\n",
                    set.tags(),
                    kernels_count(having.count()),
                    takes.join("; ")
                );
            }
            step += 1;
        }
        out += if step == 1 {
            "  1. the kernel named: no size rule, no specializations\n".to_string()
        } else {
            format!("  {step}. else the kernel itself\n")
        }
        .as_str();
    }
    out
}

fn kernels_count(n: usize) -> String {
    format!("{n} kernel{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests;
