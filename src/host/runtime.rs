//! Runtime (feature `cuda`): load generated kernels from a manifest folder through the CUDA driver
//! (cudarc, loaded at run time) and launch them on a stream. Every launch is validated first, so a
//! wrong call gets an error instead of touching memory outside its tensors. No host-device
//! synchronization happens in a launch, so launches can be captured in a CUDA graph.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use serde::Deserialize;

use crate::dtype::Dtype;
use crate::gen::spec::Family;
use crate::reference::Layout;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("{path}: {detail}")]
    Manifest { path: PathBuf, detail: String },
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("{file} cannot be loaded: its PTX ISA {isa} (made by NVRTC {nvrtc}) needs a CUDA {needed} driver, and this driver supports CUDA {driver}. Generate with the pinned NVRTC 13.0.88, or list an sm_ arch (CUBIN) for this GPU in the spec.")]
    PtxTooNew {
        file: String,
        isa: String,
        nvrtc: String,
        needed: String,
        driver: String,
    },
    #[error("{file} cannot be loaded on this GPU (sm_{cc}): {detail}")]
    Load {
        file: String,
        cc: String,
        detail: String,
    },
    #[error("no kernel in the manifest matches {0}")]
    NoKernel(String),
    #[error("{kernel}: {problem}")]
    InvalidArgument { kernel: String, problem: String },
}

fn driver(e: DriverError) -> RuntimeError {
    RuntimeError::Driver(format!("{e:?}"))
}

// ---- the manifest, as the runtime reads it ----

#[derive(Debug, Clone, Deserialize)]
pub struct ManifestView {
    pub nvrtc: NvrtcView,
    pub kernels: Vec<KernelView>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NvrtcView {
    pub release: String,
    pub ptx_isa: String,
    pub oldest_driver_cuda: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct VariantView {
    /// Absent in manifests from before other families: the pairwise merge.
    #[serde(default = "pairwise")]
    pub family: crate::gen::spec::Family,
    pub dtype: String,
    /// "same" or "fp8_e4m3".
    #[serde(default = "same")]
    pub output: String,
    /// With output "fp8_e4m3_group": group size and UE8M0.
    #[serde(default)]
    pub fp8_group: Option<crate::gen::spec::Fp8Group>,
    pub head_size: u32,
    pub prefix_threshold: bool,
    pub output_lse: bool,
    pub lse_layout: String,
    pub schedule: crate::gen::spec::Schedule,
}

fn pairwise() -> crate::gen::spec::Family {
    crate::gen::spec::Family::MergeAttnStates
}

fn same() -> String {
    "same".to_string()
}

#[derive(Debug, Clone, Deserialize)]
pub struct ParamView {
    pub name: String,
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LaunchView {
    pub vec_elems: u32,
    pub vec_bytes: u32,
    /// The output pointer's alignment (0 in manifests from before FP8 outputs: vec_bytes).
    #[serde(default)]
    pub out_vec_bytes: u32,
    pub tokens_per_block: u32,
    pub rows_per_thread: u32,
    pub heads_per_block: u32,
    pub min_blocks_per_sm: u32,
    pub block_threads: u32,
    pub shared_mem_bytes: u32,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FileView {
    pub file: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ArchView {
    pub arch: String,
    pub ptx: FileView,
    pub cubin: Option<FileView>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct KernelView {
    pub name: String,
    pub variant: VariantView,
    pub params: Vec<ParamView>,
    pub launch: LaunchView,
    pub archs: Vec<ArchView>,
}

impl KernelView {
    pub fn dtype(&self) -> Option<Dtype> {
        Dtype::from_name(&self.variant.dtype)
    }
    pub fn head_major(&self) -> bool {
        self.variant.lse_layout == "head_major"
    }
    /// The output's element type.
    pub fn output_dtype(&self) -> Option<Dtype> {
        match self.variant.output.as_str() {
            "same" => self.dtype(),
            "fp8_e4m3_group" => Some(Dtype::Fp8E4m3),
            other => Dtype::from_name(other),
        }
    }
}

/// The arguments a kernel parameter can take, resolved from its manifest name once (at load),
/// so a launch matches no strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamSlot {
    Output,
    OutputLse,
    Prefix,
    PrefixLse,
    Suffix,
    SuffixLse,
    OutputScale,
    NumTokens,
    NumHeads,
    OutputTokenStride,
    OutputHeadStride,
    PrefixTokenStride,
    PrefixHeadStride,
    SuffixTokenStride,
    SuffixHeadStride,
    PrefillTokensWithContext,
    OutputScales,
    ScaleTokenStride,
    ScaleGroupStride,
    // merge_states
    States,
    StatesLse,
    NumStates,
    StatesTokenStride,
    StatesStateStride,
    StatesHeadStride,
    // merge_state_in_place
    State,
    StateLse,
    Other,
    OtherLse,
    Mask,
    StateTokenStride,
    StateHeadStride,
    OtherTokenStride,
    OtherHeadStride,
    // mask_empty_context_lse
    Lse,
    QueryStartLoc,
    ContextStartLoc,
    NumRequests,
}

/// The most parameters a merge kernel has.
pub const MAX_PARAMS: usize = 20;

impl ParamSlot {
    /// Is this a parameter of `family`'s kernels? (A launch fills only its family's slots.)
    pub fn belongs_to(self, family: Family) -> bool {
        use ParamSlot::*;
        match self {
            NumTokens | NumHeads => true,
            Output | OutputLse | OutputTokenStride | OutputHeadStride => {
                matches!(family, Family::MergeAttnStates | Family::MergeStates { .. })
            }
            Lse | QueryStartLoc | ContextStartLoc | NumRequests => {
                family == Family::MaskEmptyContextLse
            }
            Prefix
            | PrefixLse
            | Suffix
            | SuffixLse
            | OutputScale
            | PrefixTokenStride
            | PrefixHeadStride
            | SuffixTokenStride
            | SuffixHeadStride
            | PrefillTokensWithContext
            | OutputScales
            | ScaleTokenStride
            | ScaleGroupStride => family == Family::MergeAttnStates,
            States | StatesLse | NumStates | StatesTokenStride | StatesStateStride
            | StatesHeadStride => matches!(family, Family::MergeStates { .. }),
            State | StateLse | Other | OtherLse | Mask | StateTokenStride | StateHeadStride
            | OtherTokenStride | OtherHeadStride => {
                matches!(family, Family::MergeStateInPlace { .. })
            }
        }
    }

    pub fn from_name(name: &str) -> Option<ParamSlot> {
        use ParamSlot::*;
        Some(match name {
            "output" => Output,
            "output_lse" => OutputLse,
            "prefix_output" => Prefix,
            "prefix_lse" => PrefixLse,
            "suffix_output" => Suffix,
            "suffix_lse" => SuffixLse,
            "output_scale" => OutputScale,
            "num_tokens" => NumTokens,
            "num_heads" => NumHeads,
            "output_token_stride" => OutputTokenStride,
            "output_head_stride" => OutputHeadStride,
            "prefix_token_stride" => PrefixTokenStride,
            "prefix_head_stride" => PrefixHeadStride,
            "suffix_token_stride" => SuffixTokenStride,
            "suffix_head_stride" => SuffixHeadStride,
            "prefill_tokens_with_context" => PrefillTokensWithContext,
            "output_scales" => OutputScales,
            "scale_token_stride" => ScaleTokenStride,
            "scale_group_stride" => ScaleGroupStride,
            "states" => States,
            "states_lse" => StatesLse,
            "num_states" => NumStates,
            "states_token_stride" => StatesTokenStride,
            "states_state_stride" => StatesStateStride,
            "states_head_stride" => StatesHeadStride,
            "state" => State,
            "state_lse" => StateLse,
            "other" => Other,
            "other_lse" => OtherLse,
            "mask" => Mask,
            "state_token_stride" => StateTokenStride,
            "state_head_stride" => StateHeadStride,
            "other_token_stride" => OtherTokenStride,
            "other_head_stride" => OtherHeadStride,
            "lse" => Lse,
            "query_start_loc" => QueryStartLoc,
            "context_start_loc" => ContextStartLoc,
            "num_requests" => NumRequests,
            _ => return None,
        })
    }
}

impl KernelView {
    /// The kernel's dtype and parameter slots, or why the manifest cannot be launched by this
    /// runtime.
    pub fn resolve(&self) -> Result<(Dtype, Vec<ParamSlot>), RuntimeError> {
        let bad = |problem: String| RuntimeError::InvalidArgument {
            kernel: self.name.clone(),
            problem,
        };
        let dtype = self.dtype().ok_or_else(|| {
            bad(format!(
                "unknown dtype {:?} in the manifest",
                self.variant.dtype
            ))
        })?;
        if self.params.len() > MAX_PARAMS {
            return Err(bad(format!(
                "{} parameters; this runtime takes at most {MAX_PARAMS}",
                self.params.len()
            )));
        }
        let slots = self
            .params
            .iter()
            .map(|p| {
                ParamSlot::from_name(&p.name)
                    .filter(|s| s.belongs_to(self.variant.family))
                    .ok_or_else(|| {
                        bad(format!(
                            "the manifest lists a parameter this runtime does not know for a {} kernel: {}",
                            self.variant.family.table(),
                            p.name
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((dtype, slots))
    }
}

/// Parameter values of one launch, in the kernel's order (no allocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamValues {
    values: [u64; MAX_PARAMS],
    len: usize,
}

impl std::ops::Deref for ParamValues {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.values[..self.len]
    }
}

/// One kernel, loaded.
pub struct LoadedKernel {
    pub meta: KernelView,
    dtype: Dtype,
    slots: Vec<ParamSlot>,
    /// The file it was loaded from (`kernels/x.sm_90.cubin`).
    pub loaded_from: String,
    module: sys::CUmodule,
    function: sys::CUfunction,
}

/// A device buffer handed to a launch: raw pointer, length in elements, element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    pub ptr: u64,
    pub len: usize,
    pub dtype: Dtype,
}

impl DeviceBuffer {
    fn byte_range(&self) -> (u64, u64) {
        (
            self.ptr,
            self.ptr + (self.len as u64) * u64::from(self.dtype.size_bytes()),
        )
    }
}

/// Arguments of one merge launch.
#[derive(Debug, Clone)]
pub struct MergeArgs {
    pub output: DeviceBuffer,
    pub output_lse: Option<DeviceBuffer>,
    pub prefix: DeviceBuffer,
    pub prefix_lse: DeviceBuffer,
    pub suffix: DeviceBuffer,
    pub suffix_lse: DeviceBuffer,
    /// The float32 scale of an FP8 output (required by fp8 kernels, refused by others).
    pub output_scale: Option<DeviceBuffer>,
    /// Where a per-token-group FP8 kernel writes its scales (required by those, refused by
    /// others).
    pub output_scales: Option<GroupScales>,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub output_layout: Layout,
    pub prefix_layout: Layout,
    pub suffix_layout: Layout,
    /// `None` = every token has context (n = T).
    pub prefill_tokens_with_context: Option<usize>,
}

/// The float32 scales of a per-token-group FP8 output: group g of head h of token t at
/// `t * token_stride + (h * D / group_size + g) * group_stride` (row-major, column-major and
/// padded layouts are all strides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupScales {
    pub buf: DeviceBuffer,
    pub token_stride: usize,
    pub group_stride: usize,
}

/// Kernels of one manifest, loaded into one context.
pub struct Runtime {
    pub ctx: Arc<CudaContext>,
    pub compute_capability: (i32, i32),
    pub driver_cuda: (i32, i32),
    pub manifest: ManifestView,
    kernels: Vec<LoadedKernel>,
    by_name: HashMap<String, usize>,
}

/// Is a CUDA driver library present? (Never panics, unlike touching cudarc without one.)
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { sys::is_culib_present() }
}

/// The best artifact for a device: a CUBIN of its exact arch, else one of the same major and a
/// lower minor (binary compatible), else the newest PTX not newer than the device.
fn pick_artifact(k: &KernelView, cc: (i32, i32)) -> Option<(String, bool)> {
    let dev = (cc.0 * 10 + cc.1) as u32;
    let mut best_cubin: Option<(u32, &str)> = None;
    let mut best_ptx: Option<(u32, &str)> = None;
    for a in &k.archs {
        let Ok(crate::gen::spec::Arch {
            major_minor: n,
            arch_specific: specific,
            real,
        }) = crate::gen::spec::Arch::parse(&a.arch)
        else {
            continue;
        };
        if let Some(c) = a.cubin.as_ref().filter(|_| real) {
            let compatible = if specific {
                n == dev
            } else {
                n / 10 == dev / 10 && n <= dev
            };
            if compatible && best_cubin.is_none_or(|(b, _)| n > b) {
                best_cubin = Some((n, c.file.as_str()));
            }
        }
        if !specific && n <= dev && best_ptx.is_none_or(|(b, _)| n > b) {
            best_ptx = Some((n, a.ptx.file.as_str()));
        }
    }
    best_cubin
        .map(|(_, f)| (f.to_string(), true))
        .or(best_ptx.map(|(_, f)| (f.to_string(), false)))
}

impl Runtime {
    /// Load every kernel of `dir/manifest.json` into `ctx`.
    pub fn load(ctx: Arc<CudaContext>, dir: &Path) -> Result<Runtime, RuntimeError> {
        let path = dir.join(crate::gen::emit::MANIFEST);
        let text = std::fs::read(&path).map_err(|e| RuntimeError::Manifest {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        Self::load_with(ctx, &path, &text, |file| {
            std::fs::read(dir.join(file)).map_err(|e| RuntimeError::Manifest {
                path: dir.join(file),
                detail: e.to_string(),
            })
        })
    }

    /// Load kernels embedded in a binary (what `Builder`'s generated module passes): the
    /// manifest's text and its files by their manifest paths.
    pub fn from_embedded(
        ctx: Arc<CudaContext>,
        manifest: &str,
        files: &[(&str, &[u8])],
    ) -> Result<Runtime, RuntimeError> {
        let origin = PathBuf::from("<embedded manifest.json>");
        Self::load_with(ctx, &origin, manifest.as_bytes(), |file| {
            files
                .iter()
                .find(|(name, _)| *name == file)
                .map(|(_, bytes)| bytes.to_vec())
                .ok_or_else(|| RuntimeError::Manifest {
                    path: origin.clone(),
                    detail: format!("{file} is not embedded (built with MLA_GEN_SKIP_COMPILE?)"),
                })
        })
    }

    fn load_with(
        ctx: Arc<CudaContext>,
        path: &Path,
        text: &[u8],
        read: impl Fn(&str) -> Result<Vec<u8>, RuntimeError>,
    ) -> Result<Runtime, RuntimeError> {
        let path = path.to_path_buf();
        let manifest: ManifestView =
            serde_json::from_slice(text).map_err(|e| RuntimeError::Manifest {
                path: path.clone(),
                detail: e.to_string(),
            })?;
        let cc = ctx.compute_capability().map_err(driver)?;
        let driver_cuda =
            crate::host::driver::driver_cuda_version().map_err(RuntimeError::Driver)?;
        ctx.bind_to_thread().map_err(driver)?;
        let mut kernels = Vec::new();
        let mut by_name = HashMap::new();
        for k in &manifest.kernels {
            let Some((file, _is_cubin)) = pick_artifact(k, cc) else {
                return Err(RuntimeError::Load {
                    file: k.name.clone(),
                    cc: format!("{}{}", cc.0, cc.1),
                    detail: format!(
                        "the manifest has no CUBIN or PTX for it (archs: {})",
                        k.archs
                            .iter()
                            .map(|a| a.arch.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            };
            let mut image = read(&file)?;
            if file.ends_with(".ptx") {
                image.push(0); // cuModuleLoadData takes PTX as a C string
            }
            // SAFETY: `image` is a complete CUBIN or NUL-terminated PTX and outlives the call.
            let module = match unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            {
                Ok(m) => m,
                Err(DriverError(sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION)) => {
                    return Err(RuntimeError::PtxTooNew {
                        file,
                        isa: manifest.nvrtc.ptx_isa.clone(),
                        nvrtc: manifest.nvrtc.release.clone(),
                        needed: manifest.nvrtc.oldest_driver_cuda.clone(),
                        driver: format!("{}.{}", driver_cuda.0, driver_cuda.1),
                    })
                }
                Err(e) => {
                    return Err(RuntimeError::Load {
                        file,
                        cc: format!("{}{}", cc.0, cc.1),
                        detail: format!("{e:?}"),
                    })
                }
            };
            let name = CString::new(k.name.as_str()).map_err(|_| RuntimeError::Manifest {
                path: path.clone(),
                detail: format!("kernel name {:?} holds a NUL byte", k.name),
            })?;
            // SAFETY: module just loaded; name is a valid C string.
            let function = unsafe { result::module::get_function(module, name) }.map_err(driver)?;
            let (dtype, slots) = k.resolve()?;
            by_name.insert(k.name.clone(), kernels.len());
            kernels.push(LoadedKernel {
                meta: k.clone(),
                dtype,
                slots,
                loaded_from: file,
                module,
                function,
            });
        }
        Ok(Runtime {
            ctx,
            compute_capability: cc,
            driver_cuda,
            manifest,
            kernels,
            by_name,
        })
    }

    pub fn kernels(&self) -> &[LoadedKernel] {
        &self.kernels
    }

    pub fn kernel(&self, name: &str) -> Option<&LoadedKernel> {
        self.by_name.get(name).map(|&i| &self.kernels[i])
    }

    /// Validate `args` against `kernel`'s variant and launch it on `stream`.
    pub fn launch_merge(
        &self,
        kernel: &LoadedKernel,
        stream: &CudaStream,
        args: &MergeArgs,
    ) -> Result<(), RuntimeError> {
        let checked = check(&kernel.meta, kernel.dtype, &kernel.slots, args)?;
        self.launch_checked(kernel, stream, checked)
    }

    /// Validate `args` against a `merge_states` kernel and launch it on `stream`.
    pub fn launch_states(
        &self,
        kernel: &LoadedKernel,
        stream: &CudaStream,
        args: &StatesArgs,
    ) -> Result<(), RuntimeError> {
        let checked = check_states(&kernel.meta, kernel.dtype, &kernel.slots, args)?;
        self.launch_checked(kernel, stream, checked)
    }

    /// Validate `args` against a `mask_empty_context_lse` kernel and launch it on `stream`.
    pub fn launch_mask_lse(
        &self,
        kernel: &LoadedKernel,
        stream: &CudaStream,
        args: &MaskLseArgs,
    ) -> Result<(), RuntimeError> {
        let checked = check_mask_lse(&kernel.meta, &kernel.slots, args)?;
        self.launch_checked(kernel, stream, checked)
    }

    /// Validate `args` against a `merge_state_in_place` kernel and launch it on `stream`.
    pub fn launch_in_place(
        &self,
        kernel: &LoadedKernel,
        stream: &CudaStream,
        args: &InPlaceArgs,
    ) -> Result<(), RuntimeError> {
        let checked = check_in_place(&kernel.meta, kernel.dtype, &kernel.slots, args)?;
        self.launch_checked(kernel, stream, checked)
    }

    fn launch_checked(
        &self,
        kernel: &LoadedKernel,
        stream: &CudaStream,
        checked: Option<LaunchValues>,
    ) -> Result<(), RuntimeError> {
        let Some((mut storage, (grid, block))) = checked else {
            return Ok(()); // T = 0 or H = 0: nothing to write
        };
        let len = storage.len;
        let mut params = param_pointers(&mut storage);
        let params = &mut params[..len];
        self.ctx.bind_to_thread().map_err(driver)?;
        // SAFETY: every parameter is an 8-byte value in the kernel's declared order (pointers and
        // long longs), validated above to stay inside the caller's buffers; `storage` outlives it.
        unsafe { cu_launch(kernel, stream, grid, block, params) }
    }
}

/// `cuLaunchKernel` of `kernel` on `stream`.
///
/// # Safety
/// `params` point to the kernel's parameter values in its declared order, checked against the
/// caller's buffers, and alive for the call.
unsafe fn cu_launch(
    kernel: &LoadedKernel,
    stream: &CudaStream,
    grid: [u32; 3],
    block: u32,
    params: &mut [*mut c_void],
) -> Result<(), RuntimeError> {
    // SAFETY: the caller's contract above; the function belongs to a module loaded by `load`.
    unsafe {
        result::launch_kernel(
            kernel.function,
            (grid[0], grid[1], grid[2]),
            (block, 1, 1),
            kernel.meta.launch.shared_mem_bytes,
            stream.cu_stream(),
            params,
        )
    }
    .map_err(driver)
}

impl Runtime {
    /// `cuLaunchKernel` alone, `calls` times back to back with arguments validated once:
    /// microseconds per call, the floor under any launcher on this machine (`mla-gen bench`
    /// sets it beside the runtime's own per-call cost).
    pub(crate) fn bare_launch_us(
        &self,
        kernel: &LoadedKernel,
        stream: &CudaStream,
        args: &MergeArgs,
        calls: usize,
    ) -> Result<f64, RuntimeError> {
        let (mut storage, (grid, block)) = check(&kernel.meta, kernel.dtype, &kernel.slots, args)?
            .ok_or_else(|| RuntimeError::Driver("nothing to launch for this shape".into()))?;
        let len = storage.len;
        let mut params = param_pointers(&mut storage);
        self.ctx.bind_to_thread().map_err(driver)?;
        let start = std::time::Instant::now();
        for _ in 0..calls {
            // SAFETY: as in launch_checked: validated values in ABI order, alive for the call.
            unsafe { cu_launch(kernel, stream, grid, block, &mut params[..len]) }?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / calls.max(1) as f64)
    }
}

/// cuLaunchKernel's parameter array: one pointer to each 8-byte value.
fn param_pointers(storage: &mut ParamValues) -> [*mut c_void; MAX_PARAMS] {
    let mut params = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
    for (p, v) in params.iter_mut().zip(storage.values.iter_mut()) {
        *p = v as *mut u64 as *mut c_void;
    }
    params
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            for k in &self.kernels {
                // SAFETY: loaded by `load`, unloaded once; functions die with their module.
                let _ = unsafe { result::module::unload(k.module) };
            }
        }
    }
}

type LaunchValues = (ParamValues, ([u32; 3], u32));

/// Check every argument against the kernel; return the parameter values in ABI order and the
/// launch shape, or `None` when there is nothing to launch.
pub fn validate(k: &KernelView, a: &MergeArgs) -> Result<Option<LaunchValues>, RuntimeError> {
    let (dtype, slots) = k.resolve()?;
    check(k, dtype, &slots, a)
}

/// A refusal with the kernel's name: every check below reports through one.
type Refuse<'a> = &'a dyn Fn(String) -> RuntimeError;

fn refuse_for(k: &KernelView) -> impl Fn(String) -> RuntimeError + '_ {
    |problem| RuntimeError::InvalidArgument {
        kernel: k.name.clone(),
        problem,
    }
}

/// Each buffer has the element type the kernel takes and is not null.
fn check_types(
    bad: Refuse,
    buffers: &[(&str, Option<&DeviceBuffer>, Dtype)],
) -> Result<(), RuntimeError> {
    for &(name, buf, want) in buffers {
        let Some(buf) = buf else { continue };
        if buf.dtype != want {
            return Err(bad(format!(
                "{name} is {}, the kernel takes {}",
                buf.dtype.name(),
                want.name()
            )));
        }
        if buf.ptr == 0 {
            return Err(bad(format!("{name} is a null pointer")));
        }
    }
    Ok(())
}

/// The manifest's launch rule: x = ceil(T / (tokens_per_block * rows_per_thread)),
/// y = ceil(H / heads_per_block); `None` when there is nothing to launch.
fn launch_grid(
    bad: Refuse,
    k: &KernelView,
    t: usize,
    h: usize,
) -> Result<Option<[u32; 3]>, RuntimeError> {
    let i64_max = i64::MAX as usize;
    if t > i64_max || h > i64_max {
        return Err(bad("num_tokens or num_heads does not fit in 64 bits".into()));
    }
    let grid_y = h.div_ceil(k.launch.heads_per_block.max(1) as usize);
    if grid_y > crate::gen::abi::MAX_GRID_Y as usize {
        return Err(bad(format!(
            "num_heads = {h} needs {grid_y} block rows, over the grid's y limit {}",
            crate::gen::abi::MAX_GRID_Y
        )));
    }
    let tokens_per_block = u64::from(k.launch.tokens_per_block * k.launch.rows_per_thread.max(1));
    match (t as u64).div_ceil(tokens_per_block) {
        0 => Ok(None),
        _ if h == 0 => Ok(None),
        x if x > i32::MAX as u64 => Err(bad(format!(
            "num_tokens = {t} needs more than 2^31-1 blocks"
        ))),
        x => Ok(Some([x as u32, grid_y as u32, 1])),
    }
}

/// One strided row tensor of a launch: `dims` are (label, count, stride in elements) from the
/// outermost to the head dimension (the last); rows are `head_size` contiguous elements.
struct Rows<'a> {
    name: &'a str,
    buf: &'a DeviceBuffer,
    dims: &'a [(&'a str, usize, usize)],
    /// Pointer alignment in bytes (the vector access, narrower for fp8 outputs).
    align: u32,
}

/// An output lse given to a kernel built without one would be silently left unwritten.
fn check_output_lse_wanted(bad: Refuse, k: &KernelView, given: bool) -> Result<(), RuntimeError> {
    if given && !k.variant.output_lse {
        return Err(bad(
            "output_lse given, but this kernel has no output_lse (spec: output_lse = true)".into(),
        ));
    }
    Ok(())
}

fn check_rows(bad: Refuse, k: &KernelView, r: &Rows) -> Result<(), RuntimeError> {
    let d = k.variant.head_size as usize;
    let vec = k.launch.vec_elems as usize;
    let strides: Vec<String> = r.dims.iter().map(|(_, _, s)| s.to_string()).collect();
    let strides = strides.join(", ");
    if let Some(&(_, h, head_stride)) = r.dims.last() {
        if head_stride < d && h > 1 {
            return Err(bad(format!(
                "{}: head stride {head_stride} < head size {d}",
                r.name
            )));
        }
    }
    if r.dims.iter().any(|&(_, _, s)| s % vec != 0) {
        return Err(bad(format!(
            "{}: strides ({strides}) must be multiples of {vec} elements (the kernel's {}-byte access)",
            r.name, k.launch.vec_bytes
        )));
    }
    if r.buf.ptr % u64::from(r.align) != 0 {
        return Err(bad(format!(
            "{}: pointer {:#x} is not aligned to {} bytes",
            r.name, r.buf.ptr, r.align
        )));
    }
    if r.dims.iter().any(|&(_, n, _)| n == 0) {
        return Ok(());
    }
    let last = r.dims.iter().try_fold(d, |acc, &(_, n, s)| {
        (n - 1).checked_mul(s).and_then(|x| x.checked_add(acc))
    });
    match last {
        Some(end) if end <= r.buf.len => Ok(()),
        _ => {
            let shape: Vec<String> = r.dims.iter().map(|(l, n, _)| format!("{l}={n}")).collect();
            Err(bad(format!(
                "{}: [{}, D={d}] with strides ({strides}) needs more than its {} elements",
                r.name,
                shape.join(", "),
                r.buf.len
            )))
        }
    }
}

/// Written rows must not overlap, or threads race on shared elements.
fn check_rows_disjoint(
    bad: Refuse,
    k: &KernelView,
    name: &str,
    t: usize,
    h: usize,
    l: &Layout,
) -> Result<(), RuntimeError> {
    let d = k.variant.head_size as usize;
    if t > 1 && l.token_stride < h * l.head_stride.max(d) {
        return Err(bad(format!(
            "{name}: token stride {} < num_heads * head stride ({}): rows would overlap",
            l.token_stride,
            h * l.head_stride.max(d)
        )));
    }
    Ok(())
}

/// lse arrays hold `numel` float32s, 4-byte aligned.
fn check_lse(
    bad: Refuse,
    buffers: &[(&str, Option<&DeviceBuffer>)],
    numel: usize,
    what: &str,
) -> Result<(), RuntimeError> {
    for &(name, buf) in buffers {
        let Some(buf) = buf else { continue };
        if buf.len < numel {
            return Err(bad(format!(
                "{name}: {} elements, needs {what} = {numel}",
                buf.len
            )));
        }
        if buf.ptr % 4 != 0 {
            return Err(bad(format!(
                "{name}: pointer {:#x} is not 4-byte aligned",
                buf.ptr
            )));
        }
    }
    Ok(())
}

/// No written buffer overlaps a read-only one (the kernels read inputs through the read-only
/// cache and assume no aliasing).
fn check_disjoint(
    bad: Refuse,
    written: &[(&str, Option<(u64, u64)>)],
    read: &[(&str, Option<(u64, u64)>)],
    why: &str,
) -> Result<(), RuntimeError> {
    for &(oname, o) in written {
        let Some((o0, o1)) = o else { continue };
        for &(iname, i) in read {
            let Some((i0, i1)) = i else { continue };
            if o0 < i1 && i0 < o1 {
                return Err(bad(format!("{oname} overlaps {iname}: {why}")));
            }
        }
    }
    Ok(())
}

/// A `[T, groups]` scale array: 4-byte aligned, inside its buffer, and one element per
/// (token, group) (the strides map no two of them to one element).
fn check_group_scales(
    bad: Refuse,
    sc: &GroupScales,
    t: usize,
    groups: usize,
) -> Result<(), RuntimeError> {
    let (ts, gs) = (sc.token_stride, sc.group_stride);
    if sc.buf.ptr % 4 != 0 {
        return Err(bad(format!(
            "output_scales: pointer {:#x} is not 4-byte aligned",
            sc.buf.ptr
        )));
    }
    let end = (t - 1)
        .checked_mul(ts)
        .and_then(|x| x.checked_add((groups - 1).checked_mul(gs)?))
        .and_then(|x| x.checked_add(1));
    if !matches!(end, Some(e) if e <= sc.buf.len) {
        return Err(bad(format!(
            "output_scales: [T={t}, groups={groups}] with strides ({ts}, {gs}) needs more than its {} elements",
            sc.buf.len
        )));
    }
    // Row-major-like (tokens apart by at least a row of groups) or column-major-like.
    let distinct = (t == 1 || ts >= 1)
        && (groups == 1 || gs >= 1)
        && (t == 1 || groups == 1 || ts >= groups.saturating_mul(gs) || gs >= t.saturating_mul(ts));
    if !distinct {
        return Err(bad(format!(
            "output_scales: strides ({ts}, {gs}) map two (token, group) pairs to one element; use token stride >= groups * group stride (row-major) or group stride >= T * token stride (column-major)"
        )));
    }
    Ok(())
}

fn bytes(b: Option<&DeviceBuffer>) -> Option<(u64, u64)> {
    b.map(DeviceBuffer::byte_range)
}

/// The parameter values in the kernel's order, each slot's value from `value`.
fn param_values(slots: &[ParamSlot], value: impl Fn(ParamSlot) -> u64) -> ParamValues {
    let mut values = ParamValues {
        values: [0; MAX_PARAMS],
        len: slots.len(),
    };
    for (v, &slot) in values.values.iter_mut().zip(slots) {
        *v = value(slot);
    }
    values
}

/// [`validate`] with the kernel's dtype and slots already resolved (the launch path).
pub(crate) fn check(
    k: &KernelView,
    dtype: Dtype,
    slots: &[ParamSlot],
    a: &MergeArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let bad = refuse_for(k);
    let (t, h) = (a.num_tokens, a.num_heads);
    if k.variant.family != Family::MergeAttnStates {
        return Err(bad(format!(
            "this is a {} kernel, not merge_attn_states",
            k.variant.family.table()
        )));
    }

    let out_dtype = k.output_dtype().ok_or_else(|| {
        bad(format!(
            "unknown output kind {:?} in the manifest",
            k.variant.output
        ))
    })?;
    let grouped = k.variant.fp8_group;
    let fp8 = out_dtype == Dtype::Fp8E4m3 && grouped.is_none();
    match (&a.output_scales, grouped) {
        (None, Some(_)) => {
            return Err(bad(
                "output_scales is required: this kernel writes per-token-group FP8 scales".into(),
            ))
        }
        (Some(_), None) => {
            return Err(bad(
                "output_scales given, but this kernel's output is not per-token-group FP8 (spec: output = \"fp8_e4m3_group\")".into(),
            ))
        }
        _ => {}
    }
    match (&a.output_scale, fp8) {
        (None, true) => {
            return Err(bad(
                "output_scale is required: this kernel writes FP8 e4m3".into()
            ))
        }
        (Some(_), false) if grouped.is_some() => {
            return Err(bad(
                "output_scale given, but this kernel computes one scale per token group and writes them to output_scales".into(),
            ))
        }
        (Some(_), false) => return Err(bad(
            "output_scale given, but this kernel's output is not FP8 (spec: output = \"fp8_e4m3\")"
                .into(),
        )),
        (Some(s), true) if s.len == 0 || s.ptr % 4 != 0 => {
            return Err(bad(
                "output_scale must hold one 4-byte-aligned float32".into()
            ))
        }
        _ => {}
    }
    check_types(
        &bad,
        &[
            ("output", Some(&a.output), out_dtype),
            ("output_scale", a.output_scale.as_ref(), Dtype::F32),
            ("prefix_output", Some(&a.prefix), dtype),
            ("suffix_output", Some(&a.suffix), dtype),
            ("prefix_lse", Some(&a.prefix_lse), Dtype::F32),
            ("suffix_lse", Some(&a.suffix_lse), Dtype::F32),
            ("output_lse", a.output_lse.as_ref(), Dtype::F32),
            (
                "output_scales",
                a.output_scales.as_ref().map(|g| &g.buf),
                Dtype::F32,
            ),
        ],
    )?;
    check_output_lse_wanted(&bad, k, a.output_lse.is_some())?;
    let n = match (a.prefill_tokens_with_context, k.variant.prefix_threshold) {
        (Some(n), _) if n > t => {
            return Err(bad(format!("prefill_tokens_with_context = {n} exceeds num_tokens = {t}")))
        }
        (Some(n), false) if n != t => {
            return Err(bad("prefill_tokens_with_context given, but this kernel has no threshold (spec: prefix_threshold = true)".into()))
        }
        (Some(n), _) => n,
        (None, _) => t,
    };
    let Some(grid) = launch_grid(&bad, k, t, h)? else {
        return Ok(None);
    };
    for (name, buf, l) in [
        ("output", &a.output, &a.output_layout),
        ("prefix_output", &a.prefix, &a.prefix_layout),
        ("suffix_output", &a.suffix, &a.suffix_layout),
    ] {
        // The output's vector can be narrower than the inputs' (fp8 codes are one byte).
        let align = if name == "output" && k.launch.out_vec_bytes != 0 {
            k.launch.out_vec_bytes
        } else {
            k.launch.vec_bytes
        };
        let dims = [("T", t, l.token_stride), ("H", h, l.head_stride)];
        check_rows(
            &bad,
            k,
            &Rows {
                name,
                buf,
                dims: &dims,
                align,
            },
        )?;
    }
    check_rows_disjoint(&bad, k, "output", t, h, &a.output_layout)?;
    check_lse(
        &bad,
        &[
            ("prefix_lse", Some(&a.prefix_lse)),
            ("suffix_lse", Some(&a.suffix_lse)),
            ("output_lse", a.output_lse.as_ref()),
        ],
        t * h,
        "num_tokens * num_heads",
    )?;
    let outputs = [
        ("output", bytes(Some(&a.output))),
        ("output_lse", bytes(a.output_lse.as_ref())),
    ];
    let inputs = [
        ("prefix_output", bytes(Some(&a.prefix))),
        ("suffix_output", bytes(Some(&a.suffix))),
        ("prefix_lse", bytes(Some(&a.prefix_lse))),
        ("suffix_lse", bytes(Some(&a.suffix_lse))),
    ];
    check_disjoint(&bad, &outputs, &inputs, "this kernel is not in-place")?;
    if let (Some(sc), Some(g)) = (&a.output_scales, grouped) {
        let groups = h * (k.variant.head_size / g.group_size) as usize;
        check_group_scales(&bad, sc, t, groups)?;
        let every_other: Vec<_> = outputs.iter().chain(&inputs).copied().collect();
        check_disjoint(
            &bad,
            &[("output_scales", bytes(Some(&sc.buf)))],
            &every_other,
            "the scales are written while the others are read or written",
        )?;
    }

    let values = param_values(slots, |slot| match slot {
        ParamSlot::Output => a.output.ptr,
        ParamSlot::OutputLse => a.output_lse.map_or(0, |b| b.ptr),
        ParamSlot::Prefix => a.prefix.ptr,
        ParamSlot::PrefixLse => a.prefix_lse.ptr,
        ParamSlot::Suffix => a.suffix.ptr,
        ParamSlot::SuffixLse => a.suffix_lse.ptr,
        ParamSlot::OutputScale => a.output_scale.map_or(0, |b| b.ptr),
        ParamSlot::NumTokens => t as u64,
        ParamSlot::NumHeads => h as u64,
        ParamSlot::OutputTokenStride => a.output_layout.token_stride as u64,
        ParamSlot::OutputHeadStride => a.output_layout.head_stride as u64,
        ParamSlot::PrefixTokenStride => a.prefix_layout.token_stride as u64,
        ParamSlot::PrefixHeadStride => a.prefix_layout.head_stride as u64,
        ParamSlot::SuffixTokenStride => a.suffix_layout.token_stride as u64,
        ParamSlot::SuffixHeadStride => a.suffix_layout.head_stride as u64,
        ParamSlot::PrefillTokensWithContext => n as u64,
        ParamSlot::OutputScales => a.output_scales.map_or(0, |g| g.buf.ptr),
        ParamSlot::ScaleTokenStride => a.output_scales.map_or(0, |g| g.token_stride as u64),
        ParamSlot::ScaleGroupStride => a.output_scales.map_or(0, |g| g.group_stride as u64),
        _ => 0, // resolve() admits only this family's slots
    });
    Ok(Some((values, (grid, k.launch.block_threads))))
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
    /// K: must equal the kernel's compile-time K, or be >= 1 for a runtime-K kernel.
    pub num_states: usize,
    pub output_layout: Layout,
    pub states_layout: StatesLayout,
}

/// Check a `merge_states` launch; the parameter values in ABI order and the launch shape.
pub fn validate_states(
    k: &KernelView,
    a: &StatesArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let (dtype, slots) = k.resolve()?;
    check_states(k, dtype, &slots, a)
}

fn check_states(
    k: &KernelView,
    dtype: Dtype,
    slots: &[ParamSlot],
    a: &StatesArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let bad = refuse_for(k);
    let (t, h, kk) = (a.num_tokens, a.num_heads, a.num_states);
    match k.variant.family {
        Family::MergeStates { num_states: Some(fixed) } if kk != fixed as usize => {
            return Err(bad(format!(
                "num_states = {kk}, but this kernel merges exactly {fixed} states (use a \"runtime\" kernel for other K)"
            )))
        }
        Family::MergeStates { num_states: None } if kk == 0 => {
            return Err(bad("num_states = 0: there is nothing to merge".into()))
        }
        Family::MergeStates { .. } => {}
        other => {
            return Err(bad(format!(
                "this is a {} kernel, not merge_states",
                other.table()
            )))
        }
    }
    check_types(
        &bad,
        &[
            ("output", Some(&a.output), dtype),
            ("states", Some(&a.states), dtype),
            ("states_lse", Some(&a.states_lse), Dtype::F32),
            ("output_lse", a.output_lse.as_ref(), Dtype::F32),
        ],
    )?;
    check_output_lse_wanted(&bad, k, a.output_lse.is_some())?;
    if kk > i64::MAX as usize {
        return Err(bad("num_states does not fit in 64 bits".into()));
    }
    let Some(grid) = launch_grid(&bad, k, t, h)? else {
        return Ok(None);
    };
    let (ol, sl) = (&a.output_layout, &a.states_layout);
    let out_dims = [("T", t, ol.token_stride), ("H", h, ol.head_stride)];
    let states_dims = [
        ("T", t, sl.token_stride),
        ("K", kk, sl.state_stride),
        ("H", h, sl.head_stride),
    ];
    let align = k.launch.vec_bytes;
    for (name, buf, dims) in [
        ("output", &a.output, &out_dims[..]),
        ("states", &a.states, &states_dims[..]),
    ] {
        check_rows(
            &bad,
            k,
            &Rows {
                name,
                buf,
                dims,
                align,
            },
        )?;
    }
    check_rows_disjoint(&bad, k, "output", t, h, ol)?;
    let lse_numel = t
        .checked_mul(kk)
        .and_then(|x| x.checked_mul(h))
        .ok_or_else(|| bad("num_tokens * num_states * num_heads overflows".into()))?;
    check_lse(
        &bad,
        &[("states_lse", Some(&a.states_lse))],
        lse_numel,
        "num_tokens * num_states * num_heads",
    )?;
    check_lse(
        &bad,
        &[("output_lse", a.output_lse.as_ref())],
        t * h,
        "num_tokens * num_heads",
    )?;
    check_disjoint(
        &bad,
        &[
            ("output", bytes(Some(&a.output))),
            ("output_lse", bytes(a.output_lse.as_ref())),
        ],
        &[
            ("states", bytes(Some(&a.states))),
            ("states_lse", bytes(Some(&a.states_lse))),
        ],
        "this kernel is not in-place",
    )?;
    let values = param_values(slots, |slot| match slot {
        ParamSlot::Output => a.output.ptr,
        ParamSlot::OutputLse => a.output_lse.map_or(0, |b| b.ptr),
        ParamSlot::States => a.states.ptr,
        ParamSlot::StatesLse => a.states_lse.ptr,
        ParamSlot::NumStates => kk as u64,
        ParamSlot::NumTokens => t as u64,
        ParamSlot::NumHeads => h as u64,
        ParamSlot::OutputTokenStride => ol.token_stride as u64,
        ParamSlot::OutputHeadStride => ol.head_stride as u64,
        ParamSlot::StatesTokenStride => sl.token_stride as u64,
        ParamSlot::StatesStateStride => sl.state_stride as u64,
        ParamSlot::StatesHeadStride => sl.head_stride as u64,
        _ => 0,
    });
    Ok(Some((values, (grid, k.launch.block_threads))))
}

/// Arguments of one `merge_state_in_place` launch: `state := merge(state, other)`.
#[derive(Debug, Clone)]
pub struct InPlaceArgs {
    pub state: DeviceBuffer,
    pub state_lse: DeviceBuffer,
    pub other: DeviceBuffer,
    pub other_lse: DeviceBuffer,
    /// `[T]` bytes, 0 = leave the token untouched; only for kernels with `mask = true`, and
    /// there `None` merges every token.
    pub mask: Option<MaskBuffer>,
    pub num_tokens: usize,
    pub num_heads: usize,
    pub state_layout: Layout,
    pub other_layout: Layout,
}

/// A device array of one byte per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskBuffer {
    pub ptr: u64,
    pub len: usize,
}

/// Check a `merge_state_in_place` launch; the parameter values in ABI order and the launch shape.
pub fn validate_in_place(
    k: &KernelView,
    a: &InPlaceArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let (dtype, slots) = k.resolve()?;
    check_in_place(k, dtype, &slots, a)
}

fn check_in_place(
    k: &KernelView,
    dtype: Dtype,
    slots: &[ParamSlot],
    a: &InPlaceArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let bad = refuse_for(k);
    let (t, h) = (a.num_tokens, a.num_heads);
    let Family::MergeStateInPlace { mask: has_mask } = k.variant.family else {
        return Err(bad(format!(
            "this is a {} kernel, not merge_state_in_place",
            k.variant.family.table()
        )));
    };
    check_types(
        &bad,
        &[
            ("state", Some(&a.state), dtype),
            ("state_lse", Some(&a.state_lse), Dtype::F32),
            ("other", Some(&a.other), dtype),
            ("other_lse", Some(&a.other_lse), Dtype::F32),
        ],
    )?;
    // The mask's byte range, for the overlap checks.
    let mask = match (a.mask, has_mask) {
        (Some(_), false) => {
            return Err(bad(
                "mask given, but this kernel has no mask (spec: mask = true)".into(),
            ))
        }
        (Some(m), true) if m.ptr == 0 => {
            return Err(bad(
                "mask is a null pointer (pass None to merge every token)".into(),
            ))
        }
        (Some(m), true) if m.len < t => {
            return Err(bad(format!(
                "mask: {} bytes, needs one per token = {t}",
                m.len
            )))
        }
        (Some(m), true) => Some((m.ptr, m.ptr + m.len as u64)),
        (None, _) => None,
    };
    let Some(grid) = launch_grid(&bad, k, t, h)? else {
        return Ok(None);
    };
    let align = k.launch.vec_bytes;
    for (name, buf, l) in [
        ("state", &a.state, &a.state_layout),
        ("other", &a.other, &a.other_layout),
    ] {
        let dims = [("T", t, l.token_stride), ("H", h, l.head_stride)];
        check_rows(
            &bad,
            k,
            &Rows {
                name,
                buf,
                dims: &dims,
                align,
            },
        )?;
    }
    check_rows_disjoint(&bad, k, "state", t, h, &a.state_layout)?;
    check_lse(
        &bad,
        &[
            ("state_lse", Some(&a.state_lse)),
            ("other_lse", Some(&a.other_lse)),
        ],
        t * h,
        "num_tokens * num_heads",
    )?;
    check_disjoint(
        &bad,
        &[
            ("state", bytes(Some(&a.state))),
            ("state_lse", bytes(Some(&a.state_lse))),
        ],
        &[
            ("other", bytes(Some(&a.other))),
            ("other_lse", bytes(Some(&a.other_lse))),
            ("mask", mask),
        ],
        "only state and state_lse are updated in place; the others are read while it is written",
    )?;
    check_disjoint(
        &bad,
        &[("state", bytes(Some(&a.state)))],
        &[("state_lse", bytes(Some(&a.state_lse)))],
        "both are written",
    )?;
    let values = param_values(slots, |slot| match slot {
        ParamSlot::State => a.state.ptr,
        ParamSlot::StateLse => a.state_lse.ptr,
        ParamSlot::Other => a.other.ptr,
        ParamSlot::OtherLse => a.other_lse.ptr,
        ParamSlot::Mask => a.mask.map_or(0, |m| m.ptr),
        ParamSlot::NumTokens => t as u64,
        ParamSlot::NumHeads => h as u64,
        ParamSlot::StateTokenStride => a.state_layout.token_stride as u64,
        ParamSlot::StateHeadStride => a.state_layout.head_stride as u64,
        ParamSlot::OtherTokenStride => a.other_layout.token_stride as u64,
        ParamSlot::OtherHeadStride => a.other_layout.head_stride as u64,
        _ => 0,
    });
    Ok(Some((values, (grid, k.launch.block_threads))))
}

/// Arguments of one `mask_empty_context_lse` launch.
#[derive(Debug, Clone)]
pub struct MaskLseArgs {
    /// `[H, T]` or `[T, H]` float32 (the kernel's layout), set to -inf in place.
    pub lse: DeviceBuffer,
    /// `[B + 1]` int32 token boundaries of the requests.
    pub query_start_loc: IndexBuffer,
    /// `[B + 1]` int32 context boundaries; equal neighbours = an empty context.
    pub context_start_loc: IndexBuffer,
    pub num_requests: usize,
    pub num_tokens: usize,
    pub num_heads: usize,
}

/// A device array of int32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexBuffer {
    pub ptr: u64,
    pub len: usize,
}

impl IndexBuffer {
    fn byte_range(&self) -> (u64, u64) {
        (self.ptr, self.ptr + 4 * self.len as u64)
    }
}

/// Check a `mask_empty_context_lse` launch; the parameter values in ABI order and the launch
/// shape. The start locations' contents are not read (that would need a device-to-host copy):
/// the kernel writes only its own (t, h) whatever they hold.
pub fn validate_mask_lse(
    k: &KernelView,
    a: &MaskLseArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let (_, slots) = k.resolve()?;
    check_mask_lse(k, &slots, a)
}

fn check_mask_lse(
    k: &KernelView,
    slots: &[ParamSlot],
    a: &MaskLseArgs,
) -> Result<Option<LaunchValues>, RuntimeError> {
    let bad = refuse_for(k);
    let (t, h, b) = (a.num_tokens, a.num_heads, a.num_requests);
    if k.variant.family != Family::MaskEmptyContextLse {
        return Err(bad(format!(
            "this is a {} kernel, not mask_empty_context_lse",
            k.variant.family.table()
        )));
    }
    check_types(&bad, &[("lse", Some(&a.lse), Dtype::F32)])?;
    for (name, buf) in [
        ("query_start_loc", &a.query_start_loc),
        ("context_start_loc", &a.context_start_loc),
    ] {
        if buf.ptr == 0 {
            return Err(bad(format!("{name} is a null pointer")));
        }
        if buf.ptr % 4 != 0 {
            return Err(bad(format!(
                "{name}: pointer {:#x} is not 4-byte aligned",
                buf.ptr
            )));
        }
        if buf.len < b.saturating_add(1) {
            return Err(bad(format!(
                "{name}: {} elements, needs num_requests + 1 = {}",
                buf.len,
                b.saturating_add(1)
            )));
        }
    }
    if b > i32::MAX as usize {
        return Err(bad(format!(
            "num_requests = {b} does not fit the int32 start locations"
        )));
    }
    let Some(grid) = launch_grid(&bad, k, t, h)? else {
        return Ok(None);
    };
    check_lse(
        &bad,
        &[("lse", Some(&a.lse))],
        t * h,
        "num_tokens * num_heads",
    )?;
    check_disjoint(
        &bad,
        &[("lse", bytes(Some(&a.lse)))],
        &[
            ("query_start_loc", Some(a.query_start_loc.byte_range())),
            ("context_start_loc", Some(a.context_start_loc.byte_range())),
        ],
        "the start locations are read while lse is written",
    )?;
    let values = param_values(slots, |slot| match slot {
        ParamSlot::Lse => a.lse.ptr,
        ParamSlot::QueryStartLoc => a.query_start_loc.ptr,
        ParamSlot::ContextStartLoc => a.context_start_loc.ptr,
        ParamSlot::NumRequests => b as u64,
        ParamSlot::NumTokens => t as u64,
        ParamSlot::NumHeads => h as u64,
        _ => 0,
    });
    Ok(Some((values, (grid, k.launch.block_threads))))
}

/// Element types a merge kernel takes, with the dtype they correspond to.
pub trait Element: cudarc::driver::DeviceRepr {
    const DTYPE: Dtype;
}
impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl Element for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
}
impl Element for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
/// FP8 e4m3 codes (an output type).
impl Element for u8 {
    const DTYPE: Dtype = Dtype::Fp8E4m3;
}

/// Shape and layouts of one merge: T, H and each `[T, H, D]` tensor's strides (elements).
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

/// Typed slices of one merge call (what generated bindings take). `O`, the output's element type,
/// is the inputs' `T` except for FP8 outputs (`u8` codes, with `output_scale`).
pub struct MergeSlices<'a, T: Element, O: Element = T> {
    pub output: &'a mut cudarc::driver::CudaSlice<O>,
    pub output_lse: Option<&'a mut cudarc::driver::CudaSlice<f32>>,
    pub prefix: &'a cudarc::driver::CudaSlice<T>,
    pub prefix_lse: &'a cudarc::driver::CudaSlice<f32>,
    pub suffix: &'a cudarc::driver::CudaSlice<T>,
    pub suffix_lse: &'a cudarc::driver::CudaSlice<f32>,
    /// One float32, for FP8 outputs; None otherwise.
    pub output_scale: Option<&'a cudarc::driver::CudaSlice<f32>>,
}

/// Where a per-token-group FP8 kernel writes its float32 scales: group g of head h of token t at
/// `t * token_stride + (h * D / group_size + g) * group_stride`. Row-major `[T, H*D/G]` is
/// `(H*D/G, 1)`, column-major `(1, T)`; padded rows are a larger token stride.
pub struct GroupScalesSlice<'a> {
    pub scales: &'a mut cudarc::driver::CudaSlice<f32>,
    pub token_stride: usize,
    pub group_stride: usize,
}

impl Runtime {
    /// Launch kernel `name` on typed slices: the element type must be the kernel's dtype, and
    /// every other check of [`validate`] applies. The slices' cudarc stream events are recorded,
    /// so work on other streams that uses them is ordered after this launch.
    pub fn launch_typed<T: Element, O: Element>(
        &self,
        name: &str,
        stream: &CudaStream,
        slices: MergeSlices<'_, T, O>,
        shape: MergeShape,
        prefill_tokens_with_context: Option<usize>,
    ) -> Result<(), RuntimeError> {
        self.launch_merge_slices(
            name,
            stream,
            slices,
            None,
            shape,
            prefill_tokens_with_context,
        )
    }

    /// [`Runtime::launch_typed`] for a per-token-group FP8 kernel (`output = "fp8_e4m3_group"`):
    /// e4m3 codes into `slices.output` (leave `output_scale` None) and one float32 scale per
    /// (token, group) into `scales`.
    pub fn launch_group_fp8_typed<T: Element>(
        &self,
        name: &str,
        stream: &CudaStream,
        slices: MergeSlices<'_, T, u8>,
        scales: GroupScalesSlice<'_>,
        shape: MergeShape,
        prefill_tokens_with_context: Option<usize>,
    ) -> Result<(), RuntimeError> {
        let scales = Some(scales);
        self.launch_merge_slices(
            name,
            stream,
            slices,
            scales,
            shape,
            prefill_tokens_with_context,
        )
    }

    fn launch_merge_slices<T: Element, O: Element>(
        &self,
        name: &str,
        stream: &CudaStream,
        slices: MergeSlices<'_, T, O>,
        scales: Option<GroupScalesSlice<'_>>,
        shape: MergeShape,
        prefill_tokens_with_context: Option<usize>,
    ) -> Result<(), RuntimeError> {
        let kernel = self.kernel_named(name)?;
        let (output, _o) = written(slices.output, stream);
        let output_lse = slices.output_lse.map(|l| written(l, stream));
        let (prefix, _p) = read(slices.prefix, stream);
        let (prefix_lse, _pl) = read(slices.prefix_lse, stream);
        let (suffix, _s) = read(slices.suffix, stream);
        let (suffix_lse, _sl) = read(slices.suffix_lse, stream);
        let scale = slices.output_scale.map(|s| read(s, stream));
        let group_scales =
            scales.map(|g| (written(g.scales, stream), g.token_stride, g.group_stride));
        let args = MergeArgs {
            output,
            output_lse: output_lse.as_ref().map(|(b, _)| *b),
            prefix,
            prefix_lse,
            suffix,
            suffix_lse,
            output_scale: scale.as_ref().map(|(b, _)| *b),
            output_scales: group_scales
                .as_ref()
                .map(|((buf, _), token_stride, group_stride)| GroupScales {
                    buf: *buf,
                    token_stride: *token_stride,
                    group_stride: *group_stride,
                }),
            num_tokens: shape.num_tokens,
            num_heads: shape.num_heads,
            output_layout: shape.output,
            prefix_layout: shape.prefix,
            suffix_layout: shape.suffix,
            prefill_tokens_with_context,
        };
        self.launch_merge(kernel, stream, &args)
    }
}

/// A slice the kernel reads, as a launch buffer, with the guard that records the launch's use
/// of it on `stream` (keep it alive until after the launch).
fn read<'a, T: Element>(
    s: &'a cudarc::driver::CudaSlice<T>,
    stream: &'a CudaStream,
) -> (DeviceBuffer, cudarc::driver::SyncOnDrop<'a>) {
    use cudarc::driver::DevicePtr;
    let (ptr, guard) = s.device_ptr(stream);
    let buf = DeviceBuffer {
        ptr,
        len: s.len(),
        dtype: T::DTYPE,
    };
    (buf, guard)
}

/// [`read`] for a slice the kernel writes.
fn written<'a, T: Element>(
    s: &'a mut cudarc::driver::CudaSlice<T>,
    stream: &'a CudaStream,
) -> (DeviceBuffer, cudarc::driver::SyncOnDrop<'a>) {
    use cudarc::driver::DevicePtrMut;
    let len = s.len();
    let (ptr, guard) = s.device_ptr_mut(stream);
    let buf = DeviceBuffer {
        ptr,
        len,
        dtype: T::DTYPE,
    };
    (buf, guard)
}

/// Shape of one K-way merge: T, H, K and the strides of output `[T, H, D]` and states
/// `[T, K, H, D]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatesShape {
    pub num_tokens: usize,
    pub num_heads: usize,
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

/// Typed slices of one K-way merge (what generated bindings take).
pub struct StatesSlices<'a, T: Element> {
    pub output: &'a mut cudarc::driver::CudaSlice<T>,
    pub output_lse: Option<&'a mut cudarc::driver::CudaSlice<f32>>,
    pub states: &'a cudarc::driver::CudaSlice<T>,
    pub states_lse: &'a cudarc::driver::CudaSlice<f32>,
}

/// Shape of one in-place merge: T, H and the strides of `state` and `other` (`[T, H, D]` each).
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

/// Typed slices of one in-place merge. `mask`: one byte per token (0 = untouched), for kernels
/// generated with `mask = true`.
pub struct InPlaceSlices<'a, T: Element> {
    pub state: &'a mut cudarc::driver::CudaSlice<T>,
    pub state_lse: &'a mut cudarc::driver::CudaSlice<f32>,
    pub other: &'a cudarc::driver::CudaSlice<T>,
    pub other_lse: &'a cudarc::driver::CudaSlice<f32>,
    pub mask: Option<&'a cudarc::driver::CudaSlice<u8>>,
}

impl Runtime {
    fn kernel_named(&self, name: &str) -> Result<&LoadedKernel, RuntimeError> {
        self.kernel(name)
            .ok_or_else(|| RuntimeError::NoKernel(name.to_string()))
    }

    /// Launch the `merge_states` kernel `name` on typed slices (checks of [`validate_states`]).
    pub fn launch_states_typed<T: Element>(
        &self,
        name: &str,
        stream: &CudaStream,
        slices: StatesSlices<'_, T>,
        shape: StatesShape,
    ) -> Result<(), RuntimeError> {
        let kernel = self.kernel_named(name)?;
        let (output, _o) = written(slices.output, stream);
        let output_lse = slices.output_lse.map(|l| written(l, stream));
        let (states, _s) = read(slices.states, stream);
        let (states_lse, _sl) = read(slices.states_lse, stream);
        let args = StatesArgs {
            output,
            output_lse: output_lse.as_ref().map(|(b, _)| *b),
            states,
            states_lse,
            num_tokens: shape.num_tokens,
            num_heads: shape.num_heads,
            num_states: shape.num_states,
            output_layout: shape.output,
            states_layout: shape.states,
        };
        self.launch_states(kernel, stream, &args)
    }

    /// Launch the `merge_state_in_place` kernel `name` on typed slices (checks of
    /// [`validate_in_place`]); `state`/`other` are `[T, H, D]` with the given layouts.
    pub fn launch_in_place_typed<T: Element>(
        &self,
        name: &str,
        stream: &CudaStream,
        slices: InPlaceSlices<'_, T>,
        shape: InPlaceShape,
    ) -> Result<(), RuntimeError> {
        use cudarc::driver::DevicePtr;
        let kernel = self.kernel_named(name)?;
        let (state, _st) = written(slices.state, stream);
        let (state_lse, _stl) = written(slices.state_lse, stream);
        let (other, _o) = read(slices.other, stream);
        let (other_lse, _ol) = read(slices.other_lse, stream);
        // One byte per token: not an element type of the kernels, so no DeviceBuffer.
        let mask = slices.mask.map(|m| {
            let (ptr, g) = m.device_ptr(stream);
            (MaskBuffer { ptr, len: m.len() }, g)
        });
        let args = InPlaceArgs {
            state,
            state_lse,
            other,
            other_lse,
            mask: mask.as_ref().map(|(m, _)| *m),
            num_tokens: shape.num_tokens,
            num_heads: shape.num_heads,
            state_layout: shape.state,
            other_layout: shape.other,
        };
        self.launch_in_place(kernel, stream, &args)
    }

    /// Launch the `mask_empty_context_lse` kernel `name`: `lse` is `[H, T]` or `[T, H]` (the
    /// kernel's layout); the start locations hold B + 1 int32 each (B = their length - 1).
    pub fn launch_mask_lse_typed(
        &self,
        name: &str,
        stream: &CudaStream,
        lse: &mut cudarc::driver::CudaSlice<f32>,
        (query_start_loc, context_start_loc): (
            &cudarc::driver::CudaSlice<i32>,
            &cudarc::driver::CudaSlice<i32>,
        ),
        (num_tokens, num_heads): (usize, usize),
    ) -> Result<(), RuntimeError> {
        use cudarc::driver::DevicePtr;
        let kernel = self.kernel_named(name)?;
        let (lse, _l) = written(lse, stream);
        let (q_ptr, _q) = query_start_loc.device_ptr(stream);
        let (c_ptr, _c) = context_start_loc.device_ptr(stream);
        let args = MaskLseArgs {
            lse,
            query_start_loc: IndexBuffer {
                ptr: q_ptr,
                len: query_start_loc.len(),
            },
            context_start_loc: IndexBuffer {
                ptr: c_ptr,
                len: context_start_loc.len(),
            },
            num_requests: query_start_loc.len().saturating_sub(1),
            num_tokens,
            num_heads,
        };
        self.launch_mask_lse(kernel, stream, &args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(archs: &[(&str, bool)]) -> KernelView {
        let archs: Vec<serde_json::Value> = archs
            .iter()
            .map(|(a, cubin)| {
                let mut v = serde_json::json!({"arch": a, "ptx": {"file": format!("{a}.ptx")}});
                if *cubin {
                    v["cubin"] = serde_json::json!({"file": format!("{a}.cubin")});
                }
                v
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "name": "k",
            "variant": {"dtype": "bf16", "head_size": 128, "prefix_threshold": true,
                        "output_lse": true, "lse_layout": "head_major",
                        "schedule": {"rows_per_thread": 1, "min_blocks_per_sm": 1,
                                     "block_threads": 256, "heads_per_block": 1}},
            "params": [],
            "launch": {"vec_elems": 8, "vec_bytes": 16, "tokens_per_block": 16,
                       "rows_per_thread": 1, "heads_per_block": 1, "min_blocks_per_sm": 1,
                       "block_threads": 256, "shared_mem_bytes": 0},
            "archs": archs,
        }))
        .unwrap()
    }

    #[test]
    fn the_device_gets_its_cubin_else_the_newest_ptx_it_can_jit() {
        let k = kernel(&[("sm_80", true), ("sm_90", true)]);
        let pick = |cc| pick_artifact(&k, cc);
        assert_eq!(pick((9, 0)), Some(("sm_90.cubin".into(), true)));
        assert_eq!(pick((8, 0)), Some(("sm_80.cubin".into(), true)));
        // sm_86 runs sm_80 machine code (same major, newer minor).
        assert_eq!(pick((8, 6)), Some(("sm_80.cubin".into(), true)));
        // A newer major has no CUBIN here: the newest PTX, JIT-compiled.
        assert_eq!(pick((10, 0)), Some(("sm_90.ptx".into(), false)));
        // Older than every target: nothing.
        assert_eq!(pick((7, 5)), None);
        // Arch-specific targets run only on their own architecture.
        let k = kernel(&[("sm_90a", true), ("compute_80", false)]);
        assert_eq!(pick_artifact(&k, (9, 0)).unwrap().0, "sm_90a.cubin");
        assert_eq!(pick_artifact(&k, (10, 0)).unwrap().0, "compute_80.ptx");
    }
}
