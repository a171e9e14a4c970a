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
    pub fn buffer(elem: &'a str, shape: &'a [i64]) -> Given<'a> {
        Given::Buffer {
            elem: Some(elem),
            shape: Some(shape),
        }
    }
}

/// How a kernel's contract takes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// It cannot run the call.
    No,
    /// Only the check can tell (an integer it does not take, a constant whose value the call
    /// leaves open, two tensors that disagree on a size); `unused` as below.
    Near { unused: u32 },
    /// It runs the call, leaving `unused` optional parameters (nullable or defaulted) unused.
    Yes { unused: u32 },
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
        for &(name, arg) in args {
            let Some(i) = self.params.iter().position(|p| p.name == name) else {
                match (self.constants.iter().any(|(c, _)| c == name), arg) {
                    (_, Given::Buffer { .. }) => return Fit::No,
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
                            return Fit::No;
                        }
                    }
                }
                (ParamKind::I64, Given::Int(v)) => binds[i] = v,
                _ => return Fit::No,
            }
        }
        let required = |i: usize| {
            let p = &self.params[i];
            p.kind == ParamKind::Pointer && !p.nullable
        };
        if (0..self.params.len()).any(|i| required(i) && !given[i]) {
            return Fit::No;
        }
        // Sizes: a dim that is one parameter binds it; every other dim (a constant such as
        // the head size, a product such as the group count) must equal the call's size.
        let shaped = || {
            args.iter().filter_map(|&(name, arg)| {
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
                (t.dims.len() == shape.len()).then(|| t.dims.iter().zip(shape))
            })
        };
        // Two tensors that disagree on a size: the check names which, and the size binds
        // nothing (so the verdict does not depend on the arguments' order).
        let mut disputed = [false; MAX_PARAMS];
        for (d, &size) in shaped().flatten() {
            if let Some(j) = bare(&d.size) {
                let v = size.saturating_sub(d.size.add);
                disputed[j] |= *binds[j].get_or_insert(v) != v;
            }
        }
        for (b, _) in binds.iter_mut().zip(disputed).filter(|(_, d)| *d) {
            *b = None;
            near = true;
        }
        for (d, &size) in shaped().flatten() {
            if bare(&d.size).is_none() && d.size.eval_bound(&binds).is_some_and(|v| v != size) {
                return Fit::No;
            }
        }
        for &(name, arg) in args {
            if !self.constant_holds(name, arg, &binds) {
                return Fit::No;
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
