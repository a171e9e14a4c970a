//! The arguments of a launch by name, in one place: [`NamedArgs`] (on the stack), the raw
//! [`DeviceBuffer`], the per-family argument structs of the `unsafe` raw-address API
//! ([`MergeArgs`], [`StatesArgs`], [`InPlaceArgs`], [`MaskLseArgs`]) and the [`Shape`]s the safe
//! API ([`crate::host::typed::Launch`]) takes beside its views. They name arguments; the check
//! ([`crate::host::check`]) judges them.

use std::mem::MaybeUninit;

use crate::contract::strides_of::{OTHER, OUTPUT, PREFIX, STATE, SUFFIX};
use crate::contract::Layout;
use crate::dtype::Dtype;
use crate::host::check::{Arg, MAX_PARAMS};

/// The most arguments one launch names (parameters, constants, nulls for names a kernel may
/// not take).
pub const MAX_ARGS: usize = 2 * MAX_PARAMS;

/// Arguments by name, on the stack (a launch allocates nothing). Derefs to the slice
/// [`Kernel::check`](crate::host::kernel::Kernel::check) takes.
///
/// Only the first `len` slots are set: filling all of them in advance cost every launch a few
/// kilobytes of writes. `repr(C)` keeps the count before the slots, so that starting a list
/// writes only the count (the compiler merged a count after them with the unset slots into one
/// memset of the whole).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct NamedArgs<'a> {
    len: usize,
    overflow: bool,
    items: [MaybeUninit<(&'a str, Arg<'a>)>; MAX_ARGS],
}

impl Default for NamedArgs<'_> {
    fn default() -> Self {
        NamedArgs {
            items: [MaybeUninit::uninit(); MAX_ARGS],
            len: 0,
            overflow: false,
        }
    }
}

impl<'a> NamedArgs<'a> {
    pub fn new() -> Self {
        Self::default()
    }
    /// Add one argument (past `MAX_ARGS` arguments, [`NamedArgs::overflowed`] turns true and
    /// the argument is dropped).
    pub fn push(&mut self, name: &'a str, arg: Arg<'a>) -> &mut Self {
        match self.items.get_mut(self.len) {
            Some(slot) => {
                slot.write((name, arg));
                self.len += 1;
            }
            None => self.overflow = true,
        }
        self
    }
    /// A count or stride; values past `i64::MAX` become `i64::MAX` (the check refuses them).
    pub fn int(&mut self, name: &'a str, value: usize) -> &mut Self {
        self.push(name, Arg::Int(i64::try_from(value).unwrap_or(i64::MAX)))
    }
    /// A buffer; `None` leaves the name out (a nullable parameter is then null, a required one
    /// is refused as missing).
    pub fn buffer(&mut self, name: &'a str, buf: Option<DeviceBuffer>) -> &mut Self {
        match buf {
            Some(b) => self.push(name, b.arg()),
            None => self,
        }
    }
    pub fn overflowed(&self) -> bool {
        self.overflow
    }
}

impl<'a> std::ops::Deref for NamedArgs<'a> {
    type Target = [(&'a str, Arg<'a>)];
    fn deref(&self) -> &Self::Target {
        let set = &self.items[..self.len];
        // SAFETY: `push` wrote each of the first `len` slots; MaybeUninit<T> has T's layout.
        unsafe { std::slice::from_raw_parts(set.as_ptr().cast(), set.len()) }
    }
}

impl std::fmt::Debug for NamedArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedArgs")
            .field("items", &&**self)
            .field("overflow", &self.overflow)
            .finish()
    }
}

/// A device buffer handed to a launch: raw address, length in elements, element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    pub ptr: u64,
    pub len: usize,
    pub dtype: Dtype,
}

impl DeviceBuffer {
    pub fn arg(self) -> Arg<'static> {
        Arg::Buffer {
            ptr: self.ptr,
            len: self.len as u64,
            elem: Some(self.dtype.name()),
        }
    }
}

/// Arguments of one `merge_attn_states` launch.
#[derive(Debug, Clone)]
pub struct MergeArgs {
    pub output: DeviceBuffer,
    pub output_lse: Option<DeviceBuffer>,
    pub prefix: DeviceBuffer,
    pub prefix_lse: DeviceBuffer,
    pub suffix: DeviceBuffer,
    pub suffix_lse: DeviceBuffer,
    /// The float32 scale of a per-tensor FP8 output.
    pub output_scale: Option<DeviceBuffer>,
    /// Where a per-token-group FP8 kernel writes its scales.
    pub output_scales: Option<GroupScales>,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub output_layout: Layout,
    pub prefix_layout: Layout,
    pub suffix_layout: Layout,
    /// `None`: the kernel's default (every token has context, n = T).
    pub prefill_tokens_with_context: Option<usize>,
}

/// The float32 scales of a per-token-group FP8 output: group g of head h of token t at
/// `t * token_stride + (h * D / group_size + g) * group_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupScales {
    pub buf: DeviceBuffer,
    pub token_stride: usize,
    pub group_stride: usize,
}

impl MergeArgs {
    /// The arguments by name (an option left out is absent).
    pub fn args(&self) -> NamedArgs<'static> {
        let mut a = NamedArgs::new();
        a.buffer("output", Some(self.output))
            .buffer("output_lse", self.output_lse)
            .buffer("prefix_output", Some(self.prefix))
            .buffer("prefix_lse", Some(self.prefix_lse))
            .buffer("suffix_output", Some(self.suffix))
            .buffer("suffix_lse", Some(self.suffix_lse))
            .buffer("output_scale", self.output_scale)
            .buffer("output_scales", self.output_scales.map(|g| g.buf));
        if let Some(g) = self.output_scales {
            a.int("scale_token_stride", g.token_stride)
                .int("scale_group_stride", g.group_stride);
        }
        a.int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
        strides(&mut a, OUTPUT, self.output_layout);
        strides(&mut a, PREFIX, self.prefix_layout);
        strides(&mut a, SUFFIX, self.suffix_layout);
        if let Some(n) = self.prefill_tokens_with_context {
            a.int("prefill_tokens_with_context", n);
        }
        a
    }
}

/// A `[T, H, D]` tensor's strides under their parameter names.
fn strides(a: &mut NamedArgs<'_>, names: (&'static str, &'static str), l: Layout) {
    a.int(names.0, l.token_stride).int(names.1, l.head_stride);
}

/// Strides of a `[T, K, H, D]` tensor of K states, in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatesLayout {
    pub token_stride: usize,
    pub state_stride: usize,
    pub head_stride: usize,
}

impl StatesLayout {
    pub fn contiguous(num_states: usize, num_heads: usize, head_size: usize) -> StatesLayout {
        StatesLayout {
            token_stride: num_states * num_heads * head_size,
            state_stride: num_heads * head_size,
            head_stride: head_size,
        }
    }
}

/// Arguments of one `merge_states` launch: K states `[T, K, H, D]` with lse `[T, K, H]` into
/// `[T, H, D]` and optionally lse `[T, H]`.
#[derive(Debug, Clone)]
pub struct StatesArgs {
    pub output: DeviceBuffer,
    pub output_lse: Option<DeviceBuffer>,
    pub states: DeviceBuffer,
    pub states_lse: DeviceBuffer,
    pub num_tokens: usize,
    pub num_heads: usize,
    /// K: the kernel's compile-time K, or >= 1 for a runtime-K kernel.
    pub num_states: usize,
    pub output_layout: Layout,
    pub states_layout: StatesLayout,
}

impl StatesArgs {
    pub fn args(&self) -> NamedArgs<'static> {
        let mut a = NamedArgs::new();
        a.buffer("output", Some(self.output))
            .buffer("output_lse", self.output_lse)
            .buffer("states", Some(self.states))
            .buffer("states_lse", Some(self.states_lse))
            .int("num_states", self.num_states)
            .int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
        strides(&mut a, OUTPUT, self.output_layout);
        let s = self.states_layout;
        a.int("states_token_stride", s.token_stride)
            .int("states_state_stride", s.state_stride)
            .int("states_head_stride", s.head_stride);
        a
    }
}

/// Arguments of one `merge_state_in_place` launch: `state := merge(state, other)`.
#[derive(Debug, Clone)]
pub struct InPlaceArgs {
    pub state: DeviceBuffer,
    pub state_lse: DeviceBuffer,
    pub other: DeviceBuffer,
    pub other_lse: DeviceBuffer,
    /// `[T]` bytes (dtype `U8`), 0 = leave the token untouched; for kernels with `mask = true`,
    /// where `None` merges every token.
    pub mask: Option<DeviceBuffer>,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub state_layout: Layout,
    pub other_layout: Layout,
}

impl InPlaceArgs {
    pub fn args(&self) -> NamedArgs<'static> {
        let mut a = NamedArgs::new();
        a.buffer("state", Some(self.state))
            .buffer("state_lse", Some(self.state_lse))
            .buffer("other", Some(self.other))
            .buffer("other_lse", Some(self.other_lse))
            .buffer("mask", self.mask)
            .int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
        strides(&mut a, STATE, self.state_layout);
        strides(&mut a, OTHER, self.other_layout);
        a
    }
}

/// Arguments of one `mask_empty_context_lse` launch.
#[derive(Debug, Clone)]
pub struct MaskLseArgs {
    /// `[H, T]` or `[T, H]` float32 (the kernel's layout), set to -inf in place.
    pub lse: DeviceBuffer,
    /// `[B + 1]` int32 (dtype `I32`) token boundaries of the requests.
    pub query_start_loc: DeviceBuffer,
    /// `[B + 1]` int32 context boundaries; equal neighbours = an empty context.
    pub context_start_loc: DeviceBuffer,
    pub num_requests: usize,
    pub num_tokens: usize,
    pub num_heads: usize,
}

impl MaskLseArgs {
    pub fn args(&self) -> NamedArgs<'static> {
        let mut a = NamedArgs::new();
        a.buffer("lse", Some(self.lse))
            .buffer("query_start_loc", Some(self.query_start_loc))
            .buffer("context_start_loc", Some(self.context_start_loc))
            .int("num_requests", self.num_requests)
            .int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
        a
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Integer arguments that travel together: counts and the strides of a family's tensors.
/// Sealed: the safe [`Launch::shape`](crate::host::typed::Launch::shape) trusts a shape to push
/// integers only (a buffer it pushed would reach the launch unchecked against any view), so the
/// shapes are this module's; other integers go through [`Launch::int`](crate::host::typed::Launch::int).
///
/// ```compile_fail,E0277
/// use mla_gen::runtime::{NamedArgs, Shape};
/// struct Mine;
/// impl Shape for Mine {
///     fn push_to(&self, _: &mut NamedArgs<'_>) {}
/// }
/// ```
pub trait Shape: sealed::Sealed {
    fn push_to(&self, args: &mut NamedArgs<'_>);
}

/// T, H and each `[T, H, D]` tensor's strides (elements) of a `merge_attn_states` launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MergeShape {
    pub num_tokens: usize,
    pub num_heads: usize,
    pub output: Layout,
    pub prefix: Layout,
    pub suffix: Layout,
}

impl MergeShape {
    /// Every tensor dense `[T, H, D]`.
    pub fn contiguous(num_tokens: usize, num_heads: usize, head_size: usize) -> MergeShape {
        let l = Layout::contiguous(num_heads, head_size);
        MergeShape {
            num_tokens,
            num_heads,
            output: l,
            prefix: l,
            suffix: l,
        }
    }
}

impl sealed::Sealed for MergeShape {}
impl Shape for MergeShape {
    fn push_to(&self, a: &mut NamedArgs<'_>) {
        a.int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
        strides(a, OUTPUT, self.output);
        strides(a, PREFIX, self.prefix);
        strides(a, SUFFIX, self.suffix);
    }
}

/// T, H, K and the strides of output `[T, H, D]` and states `[T, K, H, D]` (`merge_states`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatesShape {
    pub num_tokens: usize,
    pub num_heads: usize,
    /// K: the kernel's compile-time K, or any K >= 1 for a runtime-K kernel.
    pub num_states: usize,
    pub output: Layout,
    pub states: StatesLayout,
}

impl StatesShape {
    /// Every tensor dense.
    pub fn contiguous(
        num_tokens: usize,
        num_states: usize,
        num_heads: usize,
        head_size: usize,
    ) -> StatesShape {
        StatesShape {
            num_tokens,
            num_heads,
            num_states,
            output: Layout::contiguous(num_heads, head_size),
            states: StatesLayout::contiguous(num_states, num_heads, head_size),
        }
    }
}

impl sealed::Sealed for StatesShape {}
impl Shape for StatesShape {
    fn push_to(&self, a: &mut NamedArgs<'_>) {
        a.int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads)
            .int("num_states", self.num_states);
        strides(a, OUTPUT, self.output);
        let s = self.states;
        a.int("states_token_stride", s.token_stride)
            .int("states_state_stride", s.state_stride)
            .int("states_head_stride", s.head_stride);
    }
}

/// T, H and the strides of `state` and `other` (`[T, H, D]` each) of `merge_state_in_place`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InPlaceShape {
    pub num_tokens: usize,
    pub num_heads: usize,
    pub state: Layout,
    pub other: Layout,
}

impl InPlaceShape {
    /// Both tensors dense.
    pub fn contiguous(num_tokens: usize, num_heads: usize, head_size: usize) -> InPlaceShape {
        let l = Layout::contiguous(num_heads, head_size);
        InPlaceShape {
            num_tokens,
            num_heads,
            state: l,
            other: l,
        }
    }
}

impl sealed::Sealed for InPlaceShape {}
impl Shape for InPlaceShape {
    fn push_to(&self, a: &mut NamedArgs<'_>) {
        a.int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
        strides(a, STATE, self.state);
        strides(a, OTHER, self.other);
    }
}

/// B requests over T tokens of H heads (`mask_empty_context_lse`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskLseShape {
    pub num_requests: usize,
    pub num_tokens: usize,
    pub num_heads: usize,
}

impl sealed::Sealed for MaskLseShape {}
impl Shape for MaskLseShape {
    fn push_to(&self, a: &mut NamedArgs<'_>) {
        a.int("num_requests", self.num_requests)
            .int("num_tokens", self.num_tokens)
            .int("num_heads", self.num_heads);
    }
}

/// Where a per-token-group FP8 kernel writes its float32 scales: group g of head h of token t
/// at `t * token_stride + (h * D / group_size + g) * group_stride`. Row-major `[T, H*D/G]` is
/// `(H*D/G, 1)`, column-major `(1, T)`; padded rows are a larger token stride.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleLayout {
    pub token_stride: usize,
    pub group_stride: usize,
}

impl sealed::Sealed for ScaleLayout {}
impl Shape for ScaleLayout {
    fn push_to(&self, a: &mut NamedArgs<'_>) {
        a.int("scale_token_stride", self.token_stride)
            .int("scale_group_stride", self.group_stride);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slice holds what was pushed, in order, copies included; past `MAX_ARGS` a push is
    /// dropped and flagged.
    #[test]
    fn named_args_hold_what_was_pushed() {
        let mut a = NamedArgs::new();
        assert!(a.is_empty());
        a.int("num_tokens", 3).push("output_lse", Arg::Null);
        let two = a;
        assert_eq!(
            &*two,
            &[("num_tokens", Arg::Int(3)), ("output_lse", Arg::Null)]
        );
        for _ in 0..MAX_ARGS {
            a.int("num_heads", 1);
        }
        assert!(a.overflowed() && !two.overflowed());
        assert_eq!(a.len(), MAX_ARGS);
        assert_eq!(a[MAX_ARGS - 1], ("num_heads", Arg::Int(1)));
        assert!(format!("{two:?}").contains("\"output_lse\", Null"));
    }
}
