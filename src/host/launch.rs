//! Launching a loaded [`Kernel`]: every launch is checked by the kernel's
//! [`Plan`](crate::host::check::Plan) (the one generic check, docs/MANIFEST.md), then
//! `cuLaunchKernel` gets the checked values.
//!
//! The entry points here take raw device addresses, so they are `unsafe`: the check proves the
//! arguments consistent with the lengths they state, not that the memory behind an address is
//! real. The safe API is [`crate::host::typed`], whose addresses come from cudarc slices.
//!
//! The per-family structs ([`MergeArgs`], [`StatesArgs`], [`InPlaceArgs`], [`MaskLseArgs`]) are
//! conveniences that name their arguments ([`NamedArgs`]); they check nothing themselves.

use std::ffi::c_void;

use cudarc::driver::{result, sys, CudaStream};

use crate::dtype::Dtype;
use crate::host::check::{Arg, Checked, MAX_PARAMS};
use crate::host::load::Kernel;
use crate::host::runtime::RuntimeError;
use crate::reference::Layout;

impl Kernel {
    /// Check `args` (by name, any order) against the kernel's contract, without launching.
    pub fn check(&self, args: &[(&str, Arg)]) -> Result<Checked, RuntimeError> {
        Ok(self.plan.check(args)?)
    }

    /// Check `args`, then launch on `stream` (nothing is launched when the grid is empty).
    ///
    /// # Safety
    /// Every [`Arg::Buffer`] must describe device memory of this kernel's context that is
    /// allocated for at least `len` elements of its element type from `ptr`, and stays allocated
    /// (and not used by other work that races with this kernel) until the kernel has finished
    /// on `stream`. The check guarantees the rest: each tensor fits inside its stated length,
    /// alignment, strides, distinct written elements, no written buffer overlapping another.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        args: &[(&str, Arg)],
    ) -> Result<(), RuntimeError> {
        let checked = self.check(args)?;
        // SAFETY: checked by this kernel's plan just now; the caller vouches for the memory.
        unsafe { self.launch_checked(stream, &checked) }
    }

    /// Launch with values a check of this kernel returned.
    ///
    /// # Safety
    /// `checked` comes from [`Kernel::check`] (or [`crate::host::check::Plan::check`] with this
    /// kernel's plan) unmodified, and its buffers satisfy [`Kernel::launch`]'s contract.
    pub unsafe fn launch_checked(
        &self,
        stream: &CudaStream,
        checked: &Checked,
    ) -> Result<(), RuntimeError> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_checked_as(stream, checked, self.programmatic) }
    }

    /// [`Kernel::launch_checked`] with the launch kind chosen: `programmatic = false` launches
    /// plainly (`cuLaunchKernel`: the kernel starts after the previous work on `stream`, as
    /// without `pdl`); `true` launches with programmatic stream serialization and is refused
    /// unless [`Kernel::programmatic`] (a kernel that does not wait would race its producer).
    ///
    /// # Safety
    /// As [`Kernel::launch_checked`].
    pub unsafe fn launch_checked_as(
        &self,
        stream: &CudaStream,
        checked: &Checked,
        programmatic: bool,
    ) -> Result<(), RuntimeError> {
        if programmatic && !self.programmatic {
            return Err(RuntimeError::InvalidArgument(crate::host::check::Refusal {
                kernel: self.name().to_string(),
                problem: "a programmatic launch needs a pdl kernel on a device of compute capability 9.0 or newer".into(),
            }));
        }
        let Some(grid) = checked.grid else {
            return Ok(()); // T = 0 or H = 0: nothing to read or write
        };
        self.same_context(stream)?;
        let n = checked.values().len();
        if n != self.plan.param_names().count() {
            return Err(RuntimeError::InvalidArgument(crate::host::check::Refusal {
                kernel: self.name().to_string(),
                problem: format!("{n} values were checked for another kernel"),
            }));
        }
        // A size rule sends launches with fewer rows to the kernel built for them: the same
        // parameters (checked when the rule was loaded), that kernel's grid and block.
        let mut launch = (self, grid, checked.block_threads, checked.shared_mem_bytes);
        let target = self.for_values(checked.values());
        if !std::ptr::eq(target, self) {
            // (Where the rule's kernel's grid would pass a limit, this kernel serves.)
            if let Some(g) = target.plan.grid_for(checked.values()) {
                launch = (
                    target,
                    g,
                    target.plan.block_threads(),
                    target.plan.shared_mem_bytes(),
                );
            }
        }
        let (target, grid, block, shared) = launch;
        // (A rule's kernel that does not wait is launched plainly.)
        let programmatic = programmatic && target.programmatic;
        let mut values = *checked;
        let mut params = param_pointers(&mut values);
        self.context().bind_to_thread()?;
        // SAFETY: one 8-byte value per parameter in the kernel's declared order (pointers and
        // long longs), `values` alive for the call; the caller's contract covers the memory.
        unsafe { target.cu_launch(stream, grid, block, shared, &mut params[..n], programmatic) }
    }

    /// The stream must belong to the kernel's context.
    pub(crate) fn same_context(&self, stream: &CudaStream) -> Result<(), RuntimeError> {
        if stream.context().cu_ctx() == self.context().cu_ctx() {
            Ok(())
        } else {
            Err(RuntimeError::WrongContext {
                kernel: self.name().to_string(),
                what: "the stream".into(),
            })
        }
    }

    /// `cuLaunchKernel` of this kernel on `stream`, or with `programmatic`, `cuLaunchKernelEx`
    /// with programmatic stream serialization (the kernel may start before the previous one on
    /// the stream ends; its `griddepcontrol.wait` orders its memory accesses after it).
    ///
    /// # Safety
    /// `params` point to checked values in the kernel's order, alive for the call; the context
    /// is current; `programmatic` only for a kernel built with `pdl`.
    unsafe fn cu_launch(
        &self,
        stream: &CudaStream,
        grid: [u32; 3],
        block_threads: u32,
        shared_mem_bytes: u32,
        params: &mut [*mut c_void],
        programmatic: bool,
    ) -> Result<(), RuntimeError> {
        if programmatic {
            // SAFETY: as cuLaunchKernel below; the caller's contract covers the wait.
            return unsafe {
                launch_programmatic(
                    self.function,
                    grid,
                    block_threads,
                    shared_mem_bytes,
                    stream.cu_stream(),
                    params,
                )
            }
            .map_err(RuntimeError::from);
        }
        // SAFETY: the caller's contract; the function belongs to this kernel's live module.
        unsafe {
            result::launch_kernel(
                self.function,
                (grid[0], grid[1], grid[2]),
                (block_threads, 1, 1),
                shared_mem_bytes,
                stream.cu_stream(),
                params,
            )
        }?;
        Ok(())
    }

    /// `cuLaunchKernel` alone, `calls` times back to back with arguments checked once:
    /// microseconds per call, the floor under any launcher on this machine (`mla-gen bench`
    /// sets it beside the runtime's own per-call cost).
    ///
    /// # Safety
    /// As [`Kernel::launch`].
    pub(crate) unsafe fn bare_launch_us(
        &self,
        stream: &CudaStream,
        args: &[(&str, Arg)],
        calls: usize,
    ) -> Result<f64, RuntimeError> {
        let checked = self.check(args)?;
        let grid = checked
            .grid
            .ok_or_else(|| RuntimeError::Bench("nothing to launch for this shape".into()))?;
        self.same_context(stream)?;
        let mut values = checked;
        let mut params = param_pointers(&mut values);
        let n = checked.values().len();
        self.context().bind_to_thread()?;
        let start = std::time::Instant::now();
        for _ in 0..calls {
            // SAFETY: as in launch_checked: checked values in ABI order, alive for the call.
            unsafe {
                self.cu_launch(
                    stream,
                    grid,
                    checked.block_threads,
                    checked.shared_mem_bytes,
                    &mut params[..n],
                    self.programmatic,
                )
            }?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64)
    }
}

/// `cuLaunchKernelEx` of `function` with programmatic stream serialization: it may start before
/// the previous work on `stream` ends, so it must wait for that work itself before touching
/// memory (`griddepcontrol.wait`, what a `pdl` kernel does).
///
/// # Safety
/// As `cuLaunchKernel`: `params` point to the function's parameter values, alive for the call,
/// in the current context; and the function waits as said above, or races the previous work.
pub unsafe fn launch_programmatic(
    function: sys::CUfunction,
    grid: [u32; 3],
    block_threads: u32,
    shared_mem_bytes: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), cudarc::driver::DriverError> {
    // SAFETY: a plain-data union; zeroed, then its one used field set.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attr = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    };
    let config = sys::CUlaunchConfig {
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block_threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared_mem_bytes,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the caller's contract; `config` and `attr` outlive the call.
    unsafe { sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
}

/// cuLaunchKernel's parameter array: one pointer to each 8-byte value.
fn param_pointers(values: &mut Checked) -> [*mut c_void; MAX_PARAMS] {
    let mut params = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
    for (p, v) in params.iter_mut().zip(values.values_mut()) {
        *p = v as *mut u64 as *mut c_void;
    }
    params
}

/// The most arguments one launch names (parameters, constants, nulls for names a kernel may
/// not take).
pub const MAX_ARGS: usize = 2 * MAX_PARAMS;

/// Arguments by name, on the stack (a launch allocates nothing). Derefs to the slice
/// [`Kernel::check`] takes.
#[derive(Debug, Clone, Copy)]
pub struct NamedArgs<'a> {
    items: [(&'a str, Arg<'a>); MAX_ARGS],
    len: usize,
    overflow: bool,
}

impl Default for NamedArgs<'_> {
    fn default() -> Self {
        NamedArgs {
            items: [("", Arg::Null); MAX_ARGS],
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
                *slot = (name, arg);
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
        &self.items[..self.len]
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

/// The stride parameters of each `[T, H, D]` tensor: (token stride, head stride).
pub(crate) const OUTPUT: (&str, &str) = ("output_token_stride", "output_head_stride");
pub(crate) const PREFIX: (&str, &str) = ("prefix_token_stride", "prefix_head_stride");
pub(crate) const SUFFIX: (&str, &str) = ("suffix_token_stride", "suffix_head_stride");
pub(crate) const STATE: (&str, &str) = ("state_token_stride", "state_head_stride");
pub(crate) const OTHER: (&str, &str) = ("other_token_stride", "other_head_stride");

/// A `[T, H, D]` tensor's strides under their parameter names.
pub(crate) fn strides(a: &mut NamedArgs<'_>, names: (&'static str, &'static str), l: Layout) {
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
