//! Whether a call may select this kernel (docs/MANIFEST.md, "Selection"): the contract read
//! before any value is known, from the names given, their element types and the tensors'
//! sizes. What only values decide (strides, lengths, overlap, the threshold) stays the check's.

use super::{elem_matches, Plan, Resolved, MAX_PARAMS};
use crate::contract::ParamKind;

/// One argument as selection sees it: a buffer (its element type and sizes, outermost first,
/// where known) or an integer (its value where the call fixes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Given<'a> {
    Buffer {
        elem: Option<&'a str>,
        shape: Option<&'a [i64]>,
    },
    Int(Option<i64>),
}

impl<'a> Given<'a> {
    /// A buffer of element type `elem` (a manifest name) with these sizes.
    pub const fn buffer(elem: &'a str, shape: &'a [i64]) -> Given<'a> {
        Given::Buffer {
            elem: Some(elem),
            shape: Some(shape),
        }
    }
}

/// How a kernel's contract takes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// It cannot run the call, for this reason.
    No(Miss),
    /// Only the check can tell (an integer it does not take, a constant whose value the call
    /// leaves open, two tensors that disagree on a size); `unused` as below.
    Near { unused: u32 },
    /// It runs the call, leaving `unused` optional parameters (nullable or defaulted) unused.
    Yes { unused: u32 },
}

/// Why a kernel cannot run a call, as indices into the call's arguments (`arg`) and the
/// kernel's parameters (`param`): cheap to return on every selection, spelled out by
/// [`Plan::miss_text`] only when no kernel serves the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Miss {
    /// A buffer the kernel has no parameter for.
    NotTaken { arg: usize },
    /// An argument of another kind (an integer for a pointer, or the reverse).
    Kind { arg: usize, param: usize },
    /// A buffer of another element type.
    Elem { arg: usize, param: usize },
    /// A buffer the kernel needs that the call does not give.
    Missing { param: usize },
    /// A size the kernel fixes (dimension `dim` of the argument's tensor) that the call's
    /// differs from.
    Size { arg: usize, dim: usize },
    /// An integer the kernel fixes as a constant, given another value.
    Constant { arg: usize },
}

impl Resolved {
    /// The value where every factor is bound.
    fn eval_bound(&self, binds: &[Option<i64>]) -> Option<i64> {
        let mut v = self.mul;
        for &f in &self.factors {
            v = v.checked_mul(binds[f]?)?;
        }
        v.checked_add(self.add)
    }
}

impl Plan {
    /// How this kernel takes `args`. A buffer it does not take rules it out (memory the call
    /// expects it to read or write); an integer it does not take, or takes as a constant whose
    /// value the call leaves open, only its check can judge.
    pub(crate) fn fits(&self, args: &[(&str, Given)]) -> Fit {
        let mut near = false;
        let mut given = [false; MAX_PARAMS];
        let mut binds: [Option<i64>; MAX_PARAMS] = [None; MAX_PARAMS];
        for (a, &(name, arg)) in args.iter().enumerate() {
            let Some(i) = self.params.iter().position(|p| p.name == name) else {
                match (self.constants.iter().any(|(c, _)| c == name), arg) {
                    (_, Given::Buffer { .. }) => return Fit::No(Miss::NotTaken { arg: a }),
                    (true, Given::Int(v)) => near |= v.is_none(),
                    (false, Given::Int(_)) => near = true,
                }
                continue;
            };
            let p = &self.params[i];
            given[i] = true;
            match (p.kind, arg) {
                (ParamKind::Pointer, Given::Buffer { elem, .. }) => {
                    if let (Some(got), Some(want)) = (elem, p.elem.as_deref()) {
                        if !elem_matches(got, want) {
                            return Fit::No(Miss::Elem { arg: a, param: i });
                        }
                    }
                }
                (ParamKind::I64, Given::Int(v)) => binds[i] = v,
                _ => return Fit::No(Miss::Kind { arg: a, param: i }),
            }
        }
        let required = |i: usize| {
            let p = &self.params[i];
            p.kind == ParamKind::Pointer && !p.nullable
        };
        if let Some(param) = (0..self.params.len()).find(|&i| required(i) && !given[i]) {
            return Fit::No(Miss::Missing { param });
        }
        // Sizes: a dim that is one parameter binds it; every other dim (a constant such as
        // the head size, a product such as the group count) must equal the call's size.
        let shaped = || {
            args.iter().enumerate().filter_map(|(a, &(name, arg))| {
                let Given::Buffer {
                    shape: Some(shape), ..
                } = arg
                else {
                    return None;
                };
                let t = self
                    .params
                    .iter()
                    .find(|p| p.name == name)?
                    .tensor
                    .as_ref()?;
                // Another rank: the check (or the host's layout rule) names it.
                (t.dims.len() == shape.len()).then(|| {
                    t.dims
                        .iter()
                        .zip(shape)
                        .enumerate()
                        .map(move |(d, x)| (a, d, x))
                })
            })
        };
        // Two tensors that disagree on a size: the check names which, and the size binds
        // nothing (so the verdict does not depend on the arguments' order).
        let mut disputed = [false; MAX_PARAMS];
        for (_, _, (d, &size)) in shaped().flatten() {
            if let Some(j) = bare(&d.size) {
                let v = size.saturating_sub(d.size.add);
                disputed[j] |= *binds[j].get_or_insert(v) != v;
            }
        }
        for (b, _) in binds.iter_mut().zip(disputed).filter(|(_, d)| *d) {
            *b = None;
            near = true;
        }
        for (arg, dim, (d, &size)) in shaped().flatten() {
            if bare(&d.size).is_none() && d.size.eval_bound(&binds).is_some_and(|v| v != size) {
                return Fit::No(Miss::Size { arg, dim });
            }
        }
        for (arg, &(name, given)) in args.iter().enumerate() {
            if !self.constant_holds(name, given, &binds) {
                return Fit::No(Miss::Constant { arg });
            }
        }
        let unused = self
            .params
            .iter()
            .zip(given)
            .filter(|(p, given)| !given && (p.nullable || p.default.is_some()))
            .count() as u32;
        if near {
            Fit::Near { unused }
        } else {
            Fit::Yes { unused }
        }
    }

    /// A constant given a value holds it (where the constant can be evaluated); other
    /// arguments hold trivially.
    fn constant_holds(&self, name: &str, arg: Given, binds: &[Option<i64>]) -> bool {
        let Some((_, c)) = self.constants.iter().find(|(c, _)| c == name) else {
            return true;
        };
        match arg {
            Given::Int(Some(v)) => c.eval_bound(binds).is_none_or(|want| want == v),
            Given::Int(None) | Given::Buffer { .. } => true,
        }
    }

    /// What `miss` says of this kernel and `args`, in words: "needs `states_lse`, which the
    /// call does not give".
    pub(crate) fn miss_text(&self, miss: Miss, args: &[(&str, Given)]) -> String {
        let arg = |a: usize| args.get(a).map_or("?", |x| x.0);
        let param = |p: usize| self.params.get(p);
        match miss {
            Miss::NotTaken { arg: a } => format!("takes no buffer `{}`", arg(a)),
            Miss::Kind { arg: a, param: p } => {
                let is_ptr = param(p).is_some_and(|p| p.kind == ParamKind::Pointer);
                let want = if is_ptr { "a buffer" } else { "an integer" };
                format!("takes `{}` as {want}", arg(a))
            }
            Miss::Elem { arg: a, param: p } => {
                let got = match args.get(a).map(|x| x.1) {
                    Some(Given::Buffer { elem: Some(e), .. }) => e,
                    _ => "?",
                };
                let want = param(p).and_then(|p| p.elem.as_deref()).unwrap_or("?");
                format!("takes `{}` as {want}, not {got}", arg(a))
            }
            Miss::Missing { param: p } => {
                // Every buffer it needs that the call lacks, not only the first.
                let first = param(p).map_or("?", |p| p.name.as_str());
                let lacking: Vec<String> = self
                    .params
                    .iter()
                    .filter(|p| p.kind == ParamKind::Pointer && !p.nullable)
                    .filter(|p| !args.iter().any(|(n, _)| *n == p.name))
                    .map(|p| format!("`{}`", p.name))
                    .collect();
                let lacking = if lacking.is_empty() {
                    format!("`{first}`")
                } else {
                    lacking.join(", ")
                };
                format!("needs {lacking}, which the call does not give")
            }
            Miss::Size { arg: a, dim } => {
                let (name, given) = args.get(a).copied().unwrap_or(("?", Given::Int(None)));
                let got = match given {
                    Given::Buffer { shape: Some(s), .. } => s.get(dim).copied(),
                    _ => None,
                };
                let d = self
                    .params
                    .iter()
                    .find(|p| p.name == name)
                    .and_then(|p| p.tensor.as_ref())
                    .and_then(|t| t.dims.get(dim));
                match (d, got) {
                    (Some(d), Some(got)) => format!(
                        "takes `{name}` with {} = {}, not {got}",
                        d.label, d.size.text
                    ),
                    _ => format!("takes `{name}` of other sizes"),
                }
            }
            Miss::Constant { arg: a } => {
                let name = arg(a);
                let want = self
                    .constants
                    .iter()
                    .find(|(c, _)| c == name)
                    .map_or("?", |(_, c)| c.text.as_str());
                format!("fixes `{name}` at {want}")
            }
        }
    }

    /// The number of integer parameters: a size fixed at compile time beats one passed at
    /// run time.
    pub(crate) fn int_params(&self) -> u32 {
        self.params
            .iter()
            .filter(|p| p.kind == ParamKind::I64)
            .count() as u32
    }
}

/// The parameter a size is, up to an added constant (`num_tokens`, `num_requests+1`).
fn bare(e: &Resolved) -> Option<usize> {
    (e.mul == 1 && e.factors.len() == 1).then(|| e.factors[0])
}
