//! The one argument check, driven by a kernel's [`Contract`](crate::contract::Contract) from
//! the manifest. The C launcher and the Python package implement the same steps in the same
//! order with the same messages (docs/MANIFEST.md, "The check"); `tests/contract/cases.json`
//! holds the refusals all three must give.
//!
//! Needs no GPU and no driver: a [`Plan`] is built once per kernel (names resolved to indexes),
//! then [`Plan::check`] takes the arguments by name and returns the parameter values in
//! signature order and the grid, or the first rule they break. A plan remembers the last call
//! that passed, and a call that differs from it only in its buffers' addresses is checked for
//! what addresses decide (`memo.rs`): the same verdict for a fraction of the work.

mod build;
mod fits;
mod memo;
mod tensor;

pub(crate) use fits::Fit;
pub use fits::Given;

use crate::contract::{ParamKind, Role};
pub use crate::error::Refusal;
use memo::{Key, Memo};

/// The most parameters a kernel may have (the launch keeps its values on the stack).
pub const MAX_PARAMS: usize = 32;

/// One argument of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Arg<'a> {
    /// A device buffer: address, length in elements and, where the host knows it, the
    /// element type's manifest name (`bf16`, `f32`, `u8`, ...).
    Buffer {
        ptr: u64,
        len: u64,
        elem: Option<&'a str>,
    },
    /// An integer passed by value (sizes, strides, the threshold).
    Int(i64),
    /// No buffer (a null pointer): allowed for nullable parameters and for names the kernel
    /// does not take.
    Null,
}

/// What a passing check returns: parameter values in signature order (pointers as addresses)
/// and the launch shape; `grid` is `None` when there is nothing to launch (T = 0 or H = 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Checked {
    values: [u64; MAX_PARAMS],
    len: usize,
    pub grid: Option<[u32; 3]>,
    pub block_threads: u32,
    pub shared_mem_bytes: u32,
}

impl Checked {
    /// The parameter values in the kernel's order, each 8 bytes (cuLaunchKernel's array
    /// points at these).
    pub fn values(&self) -> &[u64] {
        &self.values[..self.len]
    }
    #[cfg(feature = "runtime")]
    pub(crate) fn values_mut(&mut self) -> &mut [u64] {
        &mut self.values[..self.len]
    }
}

/// An expression with names resolved: `mul * product(values[factors]) + add`.
#[derive(Debug, Clone)]
struct Resolved {
    text: String,
    mul: i64,
    factors: Vec<usize>,
    add: i64,
}

impl Resolved {
    fn eval(&self, values: &[i64]) -> Option<i64> {
        let mut v = self.mul;
        for &f in &self.factors {
            v = v.checked_mul(values[f])?;
        }
        v.checked_add(self.add)
    }
    /// `num_tokens = 512`, or `0` for a plain number.
    fn show(&self, values: &[i64]) -> String {
        match self.eval(values) {
            Some(v) if self.factors.is_empty() => v.to_string(),
            Some(v) => format!("{} = {v}", self.text),
            None => self.text.clone(),
        }
    }
    /// The single parameter this expression is (a stride the caller gives), if any.
    fn param(&self) -> Option<usize> {
        (self.mul == 1 && self.add == 0 && self.factors.len() == 1).then(|| self.factors[0])
    }
}

#[derive(Debug, Clone)]
struct Dim {
    label: String,
    size: Resolved,
    stride: Resolved,
}

#[derive(Debug, Clone)]
struct TensorPlan {
    dims: Vec<Dim>,
    align_bytes: u64,
    stride_multiple: u64,
    distinct: bool,
}

#[derive(Debug, Clone)]
struct ParamPlan {
    name: String,
    kind: ParamKind,
    role: Role,
    elem: Option<String>,
    elem_bytes: u64,
    nullable: bool,
    tensor: Option<TensorPlan>,
    min: Option<Resolved>,
    max: Option<Resolved>,
    default: Option<Resolved>,
}

#[derive(Debug, Clone)]
struct Axis {
    dim: usize,
    per_block: u64,
    limit: u64,
    name: &'static str,
}

/// A bound or limit that a launch's integers break (step 4 of the check): the parameter's
/// index and its bound, or the limit.
enum Broken<'a> {
    Min(usize, &'a Resolved),
    Max(usize, &'a Resolved),
    Limit(&'a (Resolved, i64, String)),
}

/// A kernel's contract with every name resolved, ready to check launches.
#[derive(Debug, Clone)]
pub struct Plan {
    kernel: String,
    params: Vec<ParamPlan>,
    constants: Vec<(String, Resolved)>,
    /// The contract's limits: (expression, maximum, why).
    limits: Vec<(Resolved, i64, String)>,
    axes: [Axis; 2],
    /// A constant has a parameter's name (an argument bound to the parameter is then also
    /// held to the constant in step 5).
    constant_named_like_param: bool,
    /// Step 8's pairs (i < j, in that order): two tensors of which at least one is written.
    overlap_pairs: Vec<(usize, usize)>,
    block_threads: u32,
    shared_mem_bytes: u32,
    /// The last call that passed, to check a call of the same layout by its addresses alone.
    memo: Memo,
}

impl Plan {
    pub fn kernel(&self) -> &str {
        &self.kernel
    }

    /// Whether the kernel writes through parameter `name` (`None`: no such parameter).
    pub fn writes(&self, name: &str) -> Option<bool> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.role.writes())
    }

    /// The parameter names in signature order.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.params.iter().map(|p| p.name.as_str())
    }

    /// This kernel's grid for values another kernel of the same parameters checked (a size
    /// rule's kernel launched in its place); `None` past a grid limit.
    #[cfg(feature = "runtime")]
    pub(crate) fn grid_for(&self, values: &[u64]) -> Option<[u32; 3]> {
        let mut grid = [1u32; 3];
        for (g, a) in grid.iter_mut().zip(&self.axes) {
            let blocks = values.get(a.dim)?.div_ceil(a.per_block);
            if blocks == 0 || blocks > a.limit {
                return None;
            }
            *g = u32::try_from(blocks).ok()?;
        }
        Some(grid)
    }

    /// Do values another kernel of the same parameters checked also meet this kernel's integer
    /// bounds and limits? What a specialization adds to its general kernel's contract is only
    /// those (docs/MANIFEST.md, "Specializations"), so then this kernel accepts the call too.
    pub(crate) fn accepts_values(&self, values: &[u64]) -> bool {
        let n = self.params.len();
        if values.len() != n {
            return false;
        }
        let mut ints = [0i64; MAX_PARAMS];
        for (i, p) in self.params.iter().enumerate() {
            if p.kind == ParamKind::I64 {
                ints[i] = values[i] as i64;
            }
        }
        self.broken_bound(&ints[..n], true).is_none()
    }

    #[cfg(feature = "runtime")]
    pub(crate) fn block_threads(&self) -> u32 {
        self.block_threads
    }

    #[cfg(feature = "runtime")]
    pub(crate) fn shared_mem_bytes(&self) -> u32 {
        self.shared_mem_bytes
    }

    /// Step 4: the first integer bound or limit `ints` break. A bound that overflows binds
    /// nothing in the check; `strict`: it is broken (a specialization is taken only where its
    /// bounds surely hold). A limit that overflows is exceeded either way.
    fn broken_bound(&self, ints: &[i64], strict: bool) -> Option<Broken<'_>> {
        for (i, p) in self.params.iter().enumerate() {
            if let Some(min) = &p.min {
                if min.eval(ints).map_or(strict, |m| ints[i] < m) {
                    return Some(Broken::Min(i, min));
                }
            }
            if let Some(max) = &p.max {
                if max.eval(ints).map_or(strict, |m| ints[i] > m) {
                    return Some(Broken::Max(i, max));
                }
            }
        }
        self.limits
            .iter()
            .find(|(expr, max, _)| expr.eval(ints).is_none_or(|v| v > *max))
            .map(Broken::Limit)
    }

    fn refuse(&self, problem: String) -> Refusal {
        Refusal {
            kernel: self.kernel.clone(),
            problem,
        }
    }

    /// Check one launch's arguments, given by name in any order (docs/MANIFEST.md, "The
    /// check", steps 1-8).
    pub fn check(&self, args: &[(&str, Arg)]) -> Result<Checked, Refusal> {
        let n = self.params.len();
        // Each parameter's argument, as its index in `args` (NONE: not given).
        const NONE: usize = usize::MAX;
        let mut given = [NONE; MAX_PARAMS];
        // 1. Bind each argument to a parameter or a constant. Hosts pass them in signature order
        // (the argument structs do), so the parameter after the last one bound is tried first:
        // one name comparison per argument instead of a search.
        let mut next = 0;
        let mut constant_given = false;
        for (k, &(name, arg)) in args.iter().enumerate() {
            let at = match self.params.get(next) {
                Some(p) if p.name == name => Some(next),
                _ => self.params.iter().position(|p| p.name == name),
            };
            if let Some(i) = at {
                next = i + 1;
            }
            match at {
                Some(i) if given[i] != NONE => {
                    return Err(self.refuse(format!("{name} is given twice")))
                }
                Some(i) => given[i] = k,
                None if arg == Arg::Null => {}
                None if self.constants.iter().any(|(c, _)| c == name) => {
                    if !matches!(arg, Arg::Int(_)) {
                        return Err(self.refuse(format!("{name} must be an integer")));
                    }
                    constant_given = true;
                }
                None => {
                    return Err(
                        self.refuse(format!("{name} given, but this kernel takes no {name}"))
                    )
                }
            }
        }
        // 2. Every parameter present, of the right kind and element type.
        let mut key = Key::default();
        let mut ptrs = [0u64; MAX_PARAMS];
        for (i, p) in self.params.iter().enumerate() {
            match (p.kind, args.get(given[i]).map(|a| a.1)) {
                (ParamKind::Pointer, None | Some(Arg::Null)) if p.nullable => key.unset(i),
                (ParamKind::Pointer, None) => {
                    return Err(self.refuse(format!("{} is required", p.name)))
                }
                (ParamKind::Pointer, Some(Arg::Null)) => {
                    return Err(self.refuse(format!("{} is a null pointer", p.name)))
                }
                (ParamKind::Pointer, Some(Arg::Buffer { ptr: 0, .. })) if p.nullable => {
                    key.unset(i)
                }
                (ParamKind::Pointer, Some(Arg::Buffer { ptr: 0, .. })) => {
                    return Err(self.refuse(format!("{} is a null pointer", p.name)))
                }
                (ParamKind::Pointer, Some(Arg::Buffer { ptr, len, elem })) => {
                    if let (Some(got), Some(want)) = (elem, p.elem.as_deref()) {
                        if !elem_matches(got, want) {
                            return Err(self
                                .refuse(format!("{} is {got}, the kernel takes {want}", p.name)));
                        }
                    }
                    ptrs[i] = ptr;
                    key.lens[i] = len;
                }
                (ParamKind::Pointer, Some(Arg::Int(_))) => {
                    return Err(self.refuse(format!("{} must be a buffer", p.name)))
                }
                (ParamKind::I64, Some(Arg::Int(v))) => key.ints[i] = v,
                (ParamKind::I64, None) if p.default.is_some() => key.unset(i),
                (ParamKind::I64, None) => {
                    return Err(self.refuse(format!("{} is required", p.name)))
                }
                (ParamKind::I64, Some(_)) => {
                    return Err(self.refuse(format!("{} must be an integer", p.name)))
                }
            }
        }
        // Steps 3-7 but for the addresses depend on the key alone (and on the values of constants
        // passed, which it leaves out): where the last call that passed had this key, only what
        // the addresses decide is left to check. Anything else gets the full check below.
        if !constant_given {
            if let Some(checked) = self.memo.reuse(self, &key, &ptrs) {
                return Ok(checked);
            }
        }
        let mut ints = key.ints;
        // 3. Defaults, from the values given.
        for (i, p) in self.params.iter().enumerate() {
            if p.kind == ParamKind::I64 && key.is_unset(i) {
                let d = p.default.as_ref().and_then(|d| d.eval(&ints[..n]));
                ints[i] =
                    d.ok_or_else(|| self.refuse(format!("{}: its default overflows", p.name)))?;
            }
        }
        let ints = &ints[..n];
        // 4. Ranges of the integers, then the kernel's limits.
        if let Some(broken) = self.broken_bound(ints, false) {
            return Err(self.refuse(match broken {
                Broken::Min(i, min) => format!(
                    "{} = {} is below its minimum {}",
                    self.params[i].name,
                    ints[i],
                    min.show(ints)
                ),
                Broken::Max(i, max) => format!(
                    "{} = {} exceeds its maximum {}",
                    self.params[i].name,
                    ints[i],
                    max.show(ints)
                ),
                Broken::Limit((expr, max, why)) => {
                    format!("{} exceeds {max}: {why}", expr.show(ints))
                }
            }));
        }
        // 5. Constants passed must match the kernel's. (Only a name step 1 found to be a
        // constant, or one a parameter shares, can be one: most calls pass none.)
        let constants_passed = constant_given || self.constant_named_like_param;
        for &(name, arg) in args.iter().filter(|_| constants_passed) {
            if let (Some((_, c)), Arg::Int(v)) =
                (self.constants.iter().find(|(c, _)| c == name), arg)
            {
                if c.eval(ints) != Some(v) {
                    return Err(self.refuse(format!(
                        "{name} = {v}, but this kernel is built for {name} = {}",
                        c.show(ints)
                    )));
                }
            }
        }
        // 6. The grid, from the launch rule.
        let mut grid = [1u32; 3];
        let mut empty = false;
        for (g, a) in grid.iter_mut().zip(&self.axes) {
            let count = ints[a.dim] as u64; // >= 0 after step 4
            let blocks = count.div_ceil(a.per_block);
            if blocks > a.limit {
                return Err(self.refuse(format!(
                    "{} = {count} needs {blocks} blocks in grid {}, over CUDA's limit {}",
                    self.params[a.dim].name, a.name, a.limit
                )));
            }
            empty |= blocks == 0;
            *g = blocks as u32;
        }
        let mut checked = Checked {
            values: [0; MAX_PARAMS],
            len: n,
            grid: (!empty).then_some(grid),
            block_threads: self.block_threads,
            shared_mem_bytes: self.shared_mem_bytes,
        };
        for (i, p) in self.params.iter().enumerate() {
            checked.values[i] = match p.kind {
                ParamKind::Pointer => ptrs[i],
                ParamKind::I64 => ints[i] as u64,
            };
        }
        if empty {
            return Ok(checked); // nothing is read or written
        }
        // 7. Each tensor: alignment, strides, extent, distinct elements.
        let mut spans = [0u64; MAX_PARAMS];
        for (i, p) in self.params.iter().enumerate() {
            let Some(t) = &p.tensor else { continue };
            if ptrs[i] == 0 {
                continue; // a nullable buffer left out
            }
            let extent = self.check_tensor(p, t, ptrs[i], key.lens[i], ints)?;
            spans[i] = extent.saturating_mul(p.elem_bytes);
        }
        // 8. A buffer the kernel writes shares memory with no other argument.
        if let Some((i, j)) = self.overlap(&ptrs, &spans) {
            let (a, b) = (&self.params[i], &self.params[j]);
            let writer = if a.role.writes() { &a.name } else { &b.name };
            return Err(self.refuse(format!(
                "{} overlaps {}: the kernel writes {writer}, which may share memory with no other argument",
                a.name, b.name
            )));
        }
        if !constant_given {
            self.memo.keep(key, checked, spans);
        }
        Ok(checked)
    }

    /// Step 8: the first two tensors that share memory where one is written, from each
    /// tensor's address and the bytes it spans from there (0 for a null or empty tensor).
    fn overlap(
        &self,
        ptrs: &[u64; MAX_PARAMS],
        spans: &[u64; MAX_PARAMS],
    ) -> Option<(usize, usize)> {
        let hull = |i: usize| (ptrs[i], ptrs[i].saturating_add(spans[i]));
        self.overlap_pairs.iter().copied().find(|&(i, j)| {
            let ((a0, a1), (b0, b1)) = (hull(i), hull(j));
            a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
        })
    }
}

/// FP8 codes may come as plain bytes.
fn elem_matches(got: &str, want: &str) -> bool {
    got == want || (want == "fp8_e4m3" && got == "u8")
}

#[cfg(all(test, feature = "runtime"))]
mod tests;
