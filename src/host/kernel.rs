//! One loaded kernel ([`Kernel`]): its module (unloaded when the last handle drops), function,
//! checker and size rule, and its launches. Every launch is checked by the kernel's
//! [`Plan`] (the one generic check, docs/MANIFEST.md), then `cuLaunchKernel` gets the checked
//! values.
//!
//! The entry points here take raw device addresses, so they are `unsafe`: the check proves the
//! arguments consistent with the lengths they state, not that the memory behind an address is
//! real. The safe API is [`crate::host::typed`], whose addresses come from cudarc slices.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use crate::error::RuntimeError;
use crate::host::check::{Arg, Checked, Plan, MAX_PARAMS};
use crate::host::manifest::KernelView;

/// A loaded module; unloaded (in its context) on drop.
pub(crate) struct Module {
    pub(crate) handle: sys::CUmodule,
    pub(crate) ctx: Arc<CudaContext>,
}

// SAFETY: a CUmodule is a driver handle usable from any thread once its context is current
// (every use binds `ctx` first); it is unloaded once, in Drop, when no Kernel refers to it.
unsafe impl Send for Module {}
// SAFETY: as above; nothing mutates the handle after loading.
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded by `Runtime::load_with`, unloaded only here; its functions are only
            // reachable through Kernels, which hold this module alive.
            let _ = unsafe { result::module::unload(self.handle) };
        }
    }
}

/// One kernel, loaded and ready to launch: its manifest entry, checker, function and module.
/// Share it across threads as `Arc<Kernel>` ([`Runtime::kernels`](crate::host::load::Runtime::kernels) hands out those).
#[non_exhaustive]
pub struct Kernel {
    pub meta: KernelView,
    /// The file it was loaded from (`kernels/x.sm_90.cubin`).
    pub loaded_from: String,
    pub(crate) plan: Plan,
    pub(crate) function: sys::CUfunction,
    /// Launch with programmatic stream serialization: the manifest's `launch.pdl` on a device of
    /// compute capability 9.0 or newer (decided once, at load).
    pub(crate) programmatic: bool,
    /// Launches with fewer rows run these kernels (the manifest's `launch.size_rule`).
    pub(crate) size_rule: Option<LoadedRule>,
    /// Launches these kernels accept run them instead (the manifest's `launch.specializations`).
    pub(crate) specializations: Vec<Arc<Kernel>>,
    pub(crate) module: Module,
}

/// A size rule with its kernels loaded: rows = the product of two parameters' values.
pub(crate) struct LoadedRule {
    pub(crate) rows: [usize; 2],
    pub(crate) ranges: Vec<(u64, Arc<Kernel>)>,
}

// SAFETY: the CUfunction belongs to `module`, which lives as long as this Kernel; launches
// bind the module's context before cuLaunchKernel, which may be called from any thread.
unsafe impl Send for Kernel {}
// SAFETY: as above; nothing mutates the handles after loading.
unsafe impl Sync for Kernel {}

impl Kernel {
    pub fn name(&self) -> &str {
        &self.meta.name
    }
    /// The kernel's checker (argument contract with names resolved).
    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    /// Whether launches use programmatic dependent launch (`cuLaunchKernelEx` with programmatic
    /// stream serialization): a `pdl` kernel on a device of compute capability 9.0 or newer.
    pub fn programmatic(&self) -> bool {
        self.programmatic
    }
    /// The context the kernel is loaded in: launch it on streams of this context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.module.ctx
    }

    /// The kernel a launch of this one with `rows` (tokens x heads) runs: the kernel its size
    /// rule names for them, or itself.
    pub fn for_rows(&self, rows: u64) -> &Kernel {
        self.size_rule
            .as_ref()
            .and_then(|r| r.ranges.iter().find(|(below, _)| rows < *below))
            .map_or(self, |(_, k)| k)
    }

    /// The kernel a launch with these checked values runs (see [`Kernel::for_rows`]).
    pub(crate) fn for_values(&self, values: &[u64]) -> &Kernel {
        match &self.size_rule {
            Some(r) => {
                let [a, b] = r.rows.map(|i| values.get(i).copied().unwrap_or(u64::MAX));
                self.for_rows(a.saturating_mul(b))
            }
            None => self,
        }
    }

    /// The kernel a launch with these checked values runs after this one's size rule chose it:
    /// the first of its specializations whose integer bounds and limits the values meet, or
    /// itself.
    pub(crate) fn specialized_for(&self, values: &[u64]) -> &Kernel {
        self.specializations
            .iter()
            .find(|s| s.plan.accepts_values(values))
            .map_or(self, |s| s)
    }

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
            return Err(RuntimeError::refused(
                self.name(),
                "a programmatic launch needs a pdl kernel on a device of compute capability 9.0 or newer",
            ));
        }
        let Some(grid) = checked.grid else {
            return Ok(()); // T = 0 or H = 0: nothing to read or write
        };
        self.same_context(stream)?;
        let n = checked.values().len();
        if n != self.plan.param_names().count() {
            return Err(RuntimeError::refused(
                self.name(),
                format!("{n} values were checked for another kernel"),
            ));
        }
        // A size rule sends launches with fewer rows to the kernel built for them: the same
        // parameters (checked when the rule was loaded), that kernel's grid and block.
        // Then the chosen kernel's specializations: the first that accepts the values runs.
        let mut launch = (self, grid, checked.block_threads, checked.shared_mem_bytes);
        let target = self
            .for_values(checked.values())
            .specialized_for(checked.values());
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
            .map_err(|source| RuntimeError::Launch {
                kernel: self.name().to_string(),
                call: "cuLaunchKernelEx",
                source,
            });
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
        }
        .map_err(|source| RuntimeError::Launch {
            kernel: self.name().to_string(),
            call: "cuLaunchKernel",
            source,
        })
    }

    /// The driver's launch call alone (the one [`Kernel::launch`] makes: `cuLaunchKernel`, or
    /// `cuLaunchKernelEx` for a programmatic-dependent-launch kernel), `calls` times back to back
    /// with arguments checked once: microseconds per call, the floor under any launcher on this
    /// machine (`mla-gen bench` sets it beside the runtime's own per-call cost).
    ///
    /// # Safety
    /// As [`Kernel::launch`].
    #[cfg(feature = "cli")]
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
