//! Which kernel of a manifest serves a call, from the manifest alone (docs/MANIFEST.md,
//! "Selection"): the kernels of the call's family whose contract takes it, ranked by unused
//! optional parameters, then sizes passed at run time, then `pdl`; and which kernel a launch of
//! the chosen one runs (its size rule, then its specializations). One generic function over
//! data: no family is named here. The C launcher and the Python package implement the same
//! rule; `tests/contract/select.json` holds the choices all three must make.

use std::collections::BTreeMap;

use crate::contract::{LaunchRule, Param};
use crate::host::check::{Fit, Given, Plan};
use crate::host::manifest::{KernelView, ManifestView};

/// A call as selection sees it: its family, the arguments it gives (a null buffer is not
/// given), and the options the kernels' `select` blocks name (`lse_layout`, `ue8m0`,
/// `lse_base`): each one the kernel names, and no other.
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    pub family: &'a str,
    pub args: &'a [(&'a str, Given<'a>)],
    pub options: &'a [(&'a str, &'a str)],
}

/// The kernel a call selected: its index in the manifest, and whether it serves the call
/// (`false`: no kernel does, and this one's check names what it does not take).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Choice {
    pub index: usize,
    pub serves: bool,
}

/// What selection reads of one kernel: its manifest entry's name, family, contract and
/// `select` block.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub name: &'a str,
    pub family: &'a str,
    pub params: &'a [Param],
    pub constants: &'a BTreeMap<String, String>,
    pub limits: &'a [crate::contract::Limit],
    pub launch: &'a LaunchRule,
    pub select: &'a BTreeMap<String, String>,
}

impl<'a> From<&'a KernelView> for Entry<'a> {
    fn from(k: &'a KernelView) -> Entry<'a> {
        Entry {
            name: &k.name,
            family: &k.family,
            params: &k.params,
            constants: &k.constants,
            limits: &k.limits,
            launch: &k.launch,
            select: &k.select,
        }
    }
}

/// One kernel, resolved once.
#[derive(Debug, Clone)]
struct Candidate {
    name: String,
    family: String,
    plan: Plan,
    select: Vec<(String, String)>,
    pdl: bool,
    /// Named by another kernel's size rule or specializations: launches reach it through
    /// that kernel, so no call selects it.
    reached: bool,
    rule: Option<Rule>,
    specializations: Vec<usize>,
}

/// No kernel of a manifest serves a call; the text says, per kernel of the call's family, what
/// it does not take ([`Selector::why_none`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoMatch(pub String);

impl std::fmt::Display for NoMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NoMatch {}

/// The most reasons [`Selector::why_none`] spells out.
pub const WHY_LINES: usize = 8;

impl Candidate {
    /// Does the call state exactly the options this kernel's `select` block names, alike?
    fn states_alike(&self, call: &Call) -> bool {
        self.select.len() == call.options.len()
            && self
                .select
                .iter()
                .all(|(key, value)| call.options.iter().any(|(o, v)| o == key && v == value))
    }
}

/// A size rule: the two parameters whose product counts rows, and per range (bound, kernel).
type Rule = ([usize; 2], Vec<(u64, usize)>);

/// Every kernel of a manifest, ready to select among (built once, at load).
#[derive(Debug, Clone)]
pub struct Selector {
    kernels: Vec<Candidate>,
}

impl Selector {
    /// Resolve every kernel's contract and the kernels they name; an error names what the
    /// manifest gets wrong.
    pub fn new<'a>(entries: impl IntoIterator<Item = Entry<'a>>) -> Result<Selector, String> {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let index = |name: &str| {
            entries
                .iter()
                .position(|e| e.name == name)
                .ok_or_else(|| format!("a kernel names {name}, which the manifest lacks"))
        };
        let mut kernels = Vec::with_capacity(entries.len());
        for e in &entries {
            let contract = crate::contract::Contract {
                params: e.params.to_vec(),
                constants: e.constants.clone(),
                limits: e.limits.to_vec(),
                launch: e.launch.clone(),
                select: e.select.clone(),
            };
            let plan = Plan::new(e.name, &contract)?;
            let rule = match &e.launch.size_rule {
                Some(r) => {
                    let param = |n: &str| {
                        plan.param_names().position(|p| p == n).ok_or_else(|| {
                            format!(
                                "{}: its size rule counts rows by `{n}`, which is not a parameter",
                                e.name
                            )
                        })
                    };
                    let rows = [param(&r.rows[0])?, param(&r.rows[1])?];
                    let ranges = r
                        .ranges
                        .iter()
                        .map(|x| Ok((x.below_rows, index(&x.kernel)?)))
                        .collect::<Result<_, String>>()?;
                    Some((rows, ranges))
                }
                None => None,
            };
            kernels.push(Candidate {
                name: e.name.to_string(),
                family: e.family.to_string(),
                plan,
                select: e
                    .select
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                pdl: e.launch.pdl,
                reached: false,
                rule,
                specializations: e
                    .launch
                    .specializations
                    .iter()
                    .map(|n| index(n))
                    .collect::<Result<_, String>>()?,
            });
        }
        for i in 0..kernels.len() {
            let named: Vec<usize> = kernels[i]
                .rule
                .iter()
                .flat_map(|(_, ranges)| ranges.iter().map(|r| r.1))
                .chain(kernels[i].specializations.iter().copied())
                .collect();
            for j in named {
                kernels[j].reached = true;
            }
        }
        Ok(Selector { kernels })
    }

    /// Every kernel of a manifest (read with [`ManifestView::parse`]: no GPU needed).
    pub fn of_manifest(manifest: &ManifestView) -> Result<Selector, String> {
        Selector::new(manifest.kernels.iter().map(Entry::from))
    }

    /// The kernel that serves `call`: among the kernels of its family that no other kernel
    /// names, those whose `select` block the call's options state alike (no more, no fewer)
    /// and whose contract
    /// takes the call; the fewest unused optional parameters, then the fewest integer
    /// parameters, then `pdl`, then manifest order. Where none takes it but one would be
    /// judged by its check (an integer it does not take, a constant the call leaves open, two
    /// tensors that disagree on a size), the best such one with `serves: false`.
    pub fn select(&self, call: &Call) -> Option<Choice> {
        let mut best: Option<((bool, u32, u32, bool), usize)> = None;
        for (i, k) in self.kernels.iter().enumerate() {
            if k.family != call.family || k.reached {
                continue;
            }
            // Alike both ways: an option the call states that the kernel does not name (an
            // `lse_base` of "2" before a base-e kernel) rules it out as surely as a value that
            // differs.
            if !k.states_alike(call) {
                continue;
            }
            let (near, unused) = match k.plan.fits(call.args) {
                Fit::No(_) => continue,
                Fit::Near { unused } => (true, unused),
                Fit::Yes { unused } => (false, unused),
            };
            let rank = (near, unused, k.plan.int_params(), !k.pdl);
            if best.as_ref().is_none_or(|(b, _)| rank < *b) {
                best = Some((rank, i));
            }
        }
        best.map(|((near, ..), index)| Choice {
            index,
            serves: !near,
        })
    }

    /// The kernel that serves `call`, or why none does ([`Selector::why_none`]).
    pub fn serving(&self, call: &Call) -> Result<usize, NoMatch> {
        match self.select(call) {
            Some(Choice {
                index,
                serves: true,
            }) => Ok(index),
            _ => Err(NoMatch(self.why_none(call))),
        }
    }

    /// Why no kernel serves `call`, in words: for each kernel of its family that a call may
    /// select, what it does not take (the same reasons grouped, at most [`WHY_LINES`] lines).
    /// What [`Selector::select`] found when it returns `None` or a choice that does not serve.
    pub fn why_none(&self, call: &Call) -> String {
        let family: Vec<&Candidate> = self
            .kernels
            .iter()
            .filter(|k| k.family == call.family && !k.reached)
            .collect();
        if family.is_empty() {
            let mut have: Vec<&str> = self.kernels.iter().map(|k| k.family.as_str()).collect();
            have.dedup();
            return format!(
                "the manifest has no {} kernel (it has: {}); add a [[{}]] table to the spec",
                call.family,
                have.join(", "),
                call.family
            );
        }
        // (reason, first kernel, how many more)
        let mut reasons: Vec<(String, &str, usize)> = Vec::new();
        for k in family {
            let text = match Self::miss(k, call) {
                Some(text) => text,
                None => continue,
            };
            match reasons.iter_mut().find(|r| r.0 == text) {
                Some(r) => r.2 += 1,
                None => reasons.push((text, &k.name, 0)),
            }
        }
        let mut out = format!("no {} kernel serves this call:", call.family);
        for (text, first, more) in reasons.iter().take(WHY_LINES) {
            let others = match more {
                0 => String::new(),
                1 => " (and 1 more)".to_string(),
                n => format!(" (and {n} more)"),
            };
            out += &format!("\n  {first}{others} {text}");
        }
        if reasons.len() > WHY_LINES {
            out += &format!("\n  ... {} other reasons", reasons.len() - WHY_LINES);
        }
        out
    }

    /// What kernel `k` does not take of `call`, or `None` where it serves it.
    fn miss(k: &Candidate, call: &Call) -> Option<String> {
        let named = |pairs: &mut dyn Iterator<Item = (&str, &str)>| {
            let all: Vec<String> = pairs.map(|(o, v)| format!("{o} = {v}")).collect();
            if all.is_empty() {
                "none".to_string()
            } else {
                all.join(", ")
            }
        };
        if !k.states_alike(call) {
            let kernel = named(&mut k.select.iter().map(|(o, v)| (o.as_str(), v.as_str())));
            let given = named(&mut call.options.iter().copied());
            return Some(format!(
                "is built for options {kernel}; the call states {given}"
            ));
        }
        match k.plan.fits(call.args) {
            Fit::No(miss) => Some(k.plan.miss_text(miss, call.args)),
            Fit::Near { .. } => Some(
                "may take it, but only its check can judge (an integer it does not take, a \
                 constant the call leaves open, or tensors that disagree on a size): launch \
                 it for the check's verdict"
                    .to_string(),
            ),
            Fit::Yes { .. } => None,
        }
    }

    /// The kernel a launch of kernel `index` with these checked values runs: its size rule's
    /// kernel for the rows (else itself), then the first of that one's specializations whose
    /// integer bounds and limits the values meet (else itself).
    pub fn launched(&self, index: usize, values: &[u64]) -> usize {
        let k = &self.kernels[index];
        let chosen = match &k.rule {
            Some((rows, ranges)) => {
                let [a, b] = rows.map(|i| values.get(i).copied().unwrap_or(u64::MAX));
                let rows = a.saturating_mul(b);
                ranges
                    .iter()
                    .find(|(below, _)| rows < *below)
                    .map_or(index, |r| r.1)
            }
            None => index,
        };
        self.kernels[chosen]
            .specializations
            .iter()
            .copied()
            .find(|&s| self.kernels[s].plan.accepts_values(values))
            .unwrap_or(chosen)
    }

    /// Kernel `index`'s name.
    pub fn name(&self, index: usize) -> &str {
        &self.kernels[index].name
    }

    /// Kernel `index`'s checker.
    pub fn plan(&self, index: usize) -> &Plan {
        &self.kernels[index].plan
    }
}
