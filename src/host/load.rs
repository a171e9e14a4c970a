//! Loading: every kernel of a manifest into one CUDA context ([`Runtime`]), each as a [`Kernel`]
//! (`kernel.rs`) that owns its module, its function and its checker.
//!
//! Modules are loaded through cudarc's driver layer (`cuModuleLoadData`) rather than
//! `CudaContext::load_module`, which needs cudarc's `nvrtc` feature: under an engine's
//! `dynamic-linking` that feature would link libnvrtc into every engine, for a runtime that
//! never compiles.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, DriverError};

use crate::constants::ENV_SKIP;
use crate::error::{RuntimeError, REGENERATE};
use crate::host::kernel::{Kernel, LoadedRule, Module};
use crate::host::manifest::{
    image_kind_mismatch, image_mismatch, Artifact, FileView, KernelView, ManifestView,
};
use crate::host::select::{Call, NoMatch, Selector};

/// Every kernel of one manifest, loaded into one context.
#[non_exhaustive]
pub struct Runtime {
    pub ctx: Arc<CudaContext>,
    pub compute_capability: (i32, i32),
    pub driver_cuda: (i32, i32),
    pub manifest: ManifestView,
    kernels: Vec<Arc<Kernel>>,
    by_name: HashMap<String, usize>,
    selector: Selector,
    /// The manifest loaded (`DIR/manifest.json`, or `<embedded manifest.json>`), for errors.
    origin: PathBuf,
}

// Shared across threads: an engine loads once and launches from any thread.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Runtime>();
    send_sync::<Kernel>();
};

impl Runtime {
    /// Load every kernel of `dir/manifest.json` into `ctx`. Each image is read once and checked
    /// against the manifest's size and sha256 before the driver sees it (a truncated file makes
    /// drivers crash, not fail): a damaged, missing or foreign file is an error naming it.
    pub fn load(ctx: Arc<CudaContext>, dir: impl AsRef<Path>) -> Result<Runtime, RuntimeError> {
        let dir = dir.as_ref();
        let path = dir.join(crate::contract::MANIFEST);
        let text = std::fs::read(&path).map_err(|e| RuntimeError::Manifest {
            path: path.clone(),
            detail: format!(
                "cannot read it ({e}): Runtime::load takes a folder `mla-gen generate --out` wrote"
            ),
        })?;
        Self::load_with(ctx, &path, &text, dir, |file| std::fs::read(dir.join(file)))
    }

    /// Load kernels embedded in a binary (what `Builder`'s generated module passes): the
    /// manifest's text and its files by their manifest paths (checked as [`Runtime::load`]
    /// checks files).
    pub fn from_embedded(
        ctx: Arc<CudaContext>,
        manifest: &str,
        files: &[(&str, &[u8])],
    ) -> Result<Runtime, RuntimeError> {
        let origin = PathBuf::from("<embedded manifest.json>");
        if manifest.is_empty() {
            return Err(RuntimeError::Manifest {
                path: origin,
                detail: format!(
                    "no kernels are embedded: the module was built without them ({}=1, or on docs.rs)",
                    ENV_SKIP
                ),
            });
        }
        let folder = Path::new("<embedded>");
        Self::load_with(ctx, &origin, manifest.as_bytes(), folder, |file| {
            files
                .iter()
                .find(|(name, _)| *name == file)
                .map(|(_, bytes)| bytes.to_vec())
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not embedded"))
        })
    }

    fn load_with(
        ctx: Arc<CudaContext>,
        path: &Path,
        text: &[u8],
        folder: &Path,
        read: impl Fn(&str) -> io::Result<Vec<u8>>,
    ) -> Result<Runtime, RuntimeError> {
        let manifest = ManifestView::parse(path, text)?;
        // Selection resolved once: a manifest it cannot read loads nothing.
        let selector =
            Selector::new(manifest.kernels.iter().map(Into::into)).map_err(|detail| {
                RuntimeError::Manifest {
                    path: path.to_path_buf(),
                    detail,
                }
            })?;
        let cc = ctx.compute_capability()?;
        let driver_cuda =
            crate::host::driver::driver_cuda_version().map_err(RuntimeError::NoDriver)?;
        // Every checker built and every image read and checked before the driver sees one: a
        // contract this runtime cannot read, or one damaged file, loads nothing.
        let mut ready = Vec::with_capacity(manifest.kernels.len());
        for k in &manifest.kernels {
            let plan = k.plan().map_err(|e| RuntimeError::Manifest {
                path: path.to_path_buf(),
                detail: e.detail,
            })?;
            let Some(artifact) = k.artifact(cc) else {
                return Err(RuntimeError::NoArtifact {
                    kernel: k.name.clone(),
                    cc: format!("{}{}", cc.0, cc.1),
                    archs: k
                        .archs
                        .iter()
                        .map(|a| a.arch.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            let image = checked_image(path, folder, k, &artifact, &read)?;
            ready.push((plan, artifact, image));
        }
        ctx.bind_to_thread()?;
        let mut loaded = Vec::with_capacity(manifest.kernels.len());
        let mut by_name = HashMap::new();
        for (k, (plan, artifact, image)) in manifest.kernels.iter().zip(ready) {
            let failed = |call, source| RuntimeError::Load {
                kernel: k.name.clone(),
                call,
                file: artifact.file.clone(),
                cc: format!("{}{}", cc.0, cc.1),
                source,
            };
            // SAFETY: `image` is a CUBIN that matches the manifest's size and sha256 (ELF
            // header checked) or NUL-terminated PTX, and outlives the call; the context is
            // current.
            let handle = match unsafe { result::module::load_data(image.as_ptr() as *const c_void) }
            {
                Ok(m) => m,
                Err(DriverError(sys::CUresult::CUDA_ERROR_UNSUPPORTED_PTX_VERSION)) => {
                    return Err(RuntimeError::PtxTooNew {
                        file: artifact.file,
                        isa: manifest.nvrtc.ptx_isa.clone(),
                        nvrtc: manifest.nvrtc.release.clone(),
                        needed: manifest.nvrtc.oldest_driver_cuda.clone(),
                        driver: format!("{}.{}", driver_cuda.0, driver_cuda.1),
                    })
                }
                Err(source) => return Err(failed("cuModuleLoadData", source)),
            };
            // Owned from here: an error below unloads it.
            let module = Module {
                handle,
                ctx: ctx.clone(),
            };
            let name = CString::new(k.name.as_str()).map_err(|_| RuntimeError::Manifest {
                path: path.to_path_buf(),
                detail: format!("kernel name {:?} holds a NUL byte", k.name),
            })?;
            // SAFETY: the module is loaded in the current context; name is a valid C string.
            let function = match unsafe { result::module::get_function(module.handle, name) } {
                Ok(f) => f,
                Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_FOUND)) => {
                    return Err(RuntimeError::ContractMismatch {
                        kernel: k.name.clone(),
                        file: artifact.file,
                        detail: "it holds no kernel of that name".into(),
                    })
                }
                Err(source) => return Err(failed("cuModuleGetFunction", source)),
            };
            check_params(function, k, &artifact.file, plan.param_names().count())?;
            by_name.insert(k.name.clone(), loaded.len());
            loaded.push(Kernel {
                meta: k.clone(),
                loaded_from: artifact.file,
                plan,
                function,
                programmatic: k.launch.pdl && cc.0 >= 9,
                size_rule: None,
                specializations: Vec::new(),
                module,
            });
        }
        let kernels = link_kernels(path, loaded, &by_name)?;
        Ok(Runtime {
            ctx,
            compute_capability: cc,
            driver_cuda,
            manifest,
            kernels,
            by_name,
            selector,
            origin: path.to_path_buf(),
        })
    }

    /// Every kernel, in manifest order.
    pub fn kernels(&self) -> &[Arc<Kernel>] {
        &self.kernels
    }

    /// The kernel called `name`.
    pub fn kernel(&self, name: &str) -> Option<&Arc<Kernel>> {
        self.by_name.get(name).map(|&i| &self.kernels[i])
    }

    /// The kernel that serves `call` (docs/MANIFEST.md, "Selection"): the best of its family
    /// whose contract takes the call's arguments, element types and sizes; launch it with
    /// [`crate::host::typed::Launch`] (its size rule and specializations then apply). Where
    /// no kernel serves, the error says what each kernel of the family does not take;
    /// [`Runtime::select_for_check`] gives the kernel whose check would name the problem, if
    /// one would.
    pub fn select(&self, call: &Call) -> Result<&Arc<Kernel>, NoMatch> {
        self.selector.serving(call).map(|i| &self.kernels[i])
    }

    /// As [`Runtime::select`], with whether the kernel serves the call: `false` where none
    /// does and this one's check would name the problem (an integer it does not take, a
    /// constant the call leaves open, tensors that disagree on a size).
    pub fn select_for_check(&self, call: &Call) -> Option<(&Arc<Kernel>, bool)> {
        let c = self.selector.select(call)?;
        Some((&self.kernels[c.index], c.serves))
    }

    /// The kernel called `name`, or [`RuntimeError::NoKernel`] (what a generated module's
    /// `load` resolves each kernel with, once).
    pub fn require(&self, name: &str) -> Result<Arc<Kernel>, RuntimeError> {
        self.kernel(name)
            .cloned()
            .ok_or_else(|| RuntimeError::NoKernel(format!("{name} (in {})", self.origin.display())))
    }
}

/// Kernel `k`'s image, read and checked against the manifest: a path inside the folder, there,
/// of the recorded size and sha256, and of its kind (an ELF CUBIN, or PTX text that gets its
/// NUL terminator here). Hashing happens once per load, never on a launch.
fn checked_image(
    manifest_path: &Path,
    folder: &Path,
    k: &KernelView,
    artifact: &Artifact,
    read: &impl Fn(&str) -> io::Result<Vec<u8>>,
) -> Result<Vec<u8>, RuntimeError> {
    if !FileView::inside_folder(&artifact.file) {
        return Err(RuntimeError::Manifest {
            path: manifest_path.to_path_buf(),
            detail: format!(
                "kernel {}: its image {:?} is not a path inside the folder (absolute, or through `..`): refused; {REGENERATE}",
                k.name, artifact.file
            ),
        });
    }
    let file = folder.join(&artifact.file);
    let mut image = read(&artifact.file).map_err(|e| RuntimeError::MissingImage {
        kernel: k.name.clone(),
        file: file.clone(),
        detail: e.to_string(),
    })?;
    if let Some(m) = image_mismatch(artifact.bytes, artifact.sha256.as_deref(), &image) {
        return Err(RuntimeError::ImageMismatch {
            kernel: k.name.clone(),
            file,
            differs: Box::new(m),
        });
    }
    if let Some(kind) = image_kind_mismatch(artifact.cubin, &image) {
        return Err(RuntimeError::ContractMismatch {
            kernel: k.name.clone(),
            file: artifact.file.clone(),
            detail: format!("it is not {kind}, as the manifest says"),
        });
    }
    if !artifact.cubin {
        image.push(0); // cuModuleLoadData takes PTX as a C string
    }
    Ok(image)
}

/// The image's parameters against the contract's: as many, each 8 bytes (a device address or a
/// 64-bit integer, what every launch passes). Asked of the driver where it can say
/// (`cuFuncGetParamInfo`, CUDA 12.4 drivers and newer); skipped where it cannot.
fn check_params(
    function: sys::CUfunction,
    k: &KernelView,
    file: &str,
    expected: usize,
) -> Result<(), RuntimeError> {
    let Some(queries) = crate::host::driver::param_queries() else {
        return Ok(());
    };
    const SUCCESS: i32 = 0;
    const INVALID_VALUE: i32 = 1;
    let mismatch = |detail: String| RuntimeError::ContractMismatch {
        kernel: k.name.clone(),
        file: file.to_string(),
        detail,
    };
    // Every count mismatch in one wording; `None`: more than the contract's, how many unknown.
    let wrong_count = |taken: Option<usize>| {
        mismatch(match taken {
            Some(n) if n < expected => format!("it takes {n} parameters, the contract {expected}"),
            Some(n) => format!("it takes {n} parameters, more than the contract's {expected}"),
            None => format!("it takes more than the contract's {expected} parameters"),
        })
    };
    // Where the driver counts (`cuFuncGetParamCount`), no query fails on a good image; else the
    // index one past the contract's count is asked and must not exist, a failing call that
    // compute-sanitizer reports as an API error unless given `--report-api-errors no`.
    let mut count = 0usize;
    // SAFETY: a function of a loaded module; an out-pointer to a live local.
    let counted = queries
        .count
        .is_some_and(|f| unsafe { f(function, &mut count) } == SUCCESS);
    if counted && count != expected {
        return Err(wrong_count(Some(count)));
    }
    let asked = if counted { expected } else { expected + 1 };
    for index in 0..asked {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a function of a loaded module; out-pointers to live locals.
        let rc = unsafe { (queries.info)(function, index, &mut offset, &mut size) };
        match (rc, index == expected) {
            (SUCCESS, false) if size == 8 => {}
            (SUCCESS, false) => {
                return Err(mismatch(format!(
                    "its parameter {index} is {size} bytes, where the contract's `{}` is 8",
                    k.params.get(index).map_or("?", |p| p.name.as_str())
                )))
            }
            (SUCCESS, true) => return Err(wrong_count(None)),
            (INVALID_VALUE, false) if index > 0 => return Err(wrong_count(Some(index))),
            // Past the end as expected, or a driver that cannot say.
            _ => return Ok(()),
        }
    }
    Ok(())
}

/// Share the loaded kernels, each holding the kernels its size rule and specializations name. A
/// named kernel must be in the manifest, take the same parameters and name no kernel of this one
/// (no cycle); kernels are shared once every kernel they name is.
fn link_kernels(
    path: &Path,
    loaded: Vec<Kernel>,
    by_name: &HashMap<String, usize>,
) -> Result<Vec<Arc<Kernel>>, RuntimeError> {
    let bad = |detail: String| RuntimeError::Manifest {
        path: path.to_path_buf(),
        detail,
    };
    let names = |k: &Kernel| -> Vec<String> {
        let rule = k.meta.launch.size_rule.iter().flat_map(|r| &r.ranges);
        rule.map(|r| r.kernel.clone())
            .chain(k.meta.launch.specializations.iter().cloned())
            .collect()
    };
    let mut slots: Vec<Option<Kernel>> = loaded.into_iter().map(Some).collect();
    let mut shared: Vec<Option<Arc<Kernel>>> = vec![None; slots.len()];
    loop {
        let mut progress = false;
        for i in 0..slots.len() {
            let Some(k) = slots[i].as_ref() else { continue };
            let named = names(k);
            let mut targets = Vec::with_capacity(named.len());
            for n in &named {
                let j = *by_name.get(n).ok_or_else(|| {
                    bad(format!(
                        "{}: names {n}, which the manifest lacks",
                        k.meta.name
                    ))
                })?;
                targets.push(shared[j].clone());
            }
            if targets.iter().any(Option::is_none) {
                continue; // a named kernel is not shared yet
            }
            let mut k = slots[i].take().unwrap_or_else(|| unreachable!());
            let targets: Vec<Arc<Kernel>> = targets.into_iter().flatten().collect();
            if let Some(t) = targets
                .iter()
                .find(|t| !t.plan.param_names().eq(k.plan.param_names()))
            {
                return Err(bad(format!(
                    "{}: names {}, whose parameters differ",
                    k.meta.name, t.meta.name
                )));
            }
            let (ranges, specializations) = targets.split_at(
                k.meta
                    .launch
                    .size_rule
                    .as_ref()
                    .map_or(0, |r| r.ranges.len()),
            );
            if let Some(rule) = k.meta.launch.size_rule.clone() {
                let param = |name: &str| {
                    k.plan.param_names().position(|p| p == name).ok_or_else(|| {
                        bad(format!(
                            "{}: its size rule counts rows by `{name}`, which is not a parameter",
                            k.meta.name
                        ))
                    })
                };
                let rows = [param(&rule.rows[0])?, param(&rule.rows[1])?];
                let ranges = rule
                    .ranges
                    .iter()
                    .map(|r| r.below_rows)
                    .zip(ranges.iter().cloned())
                    .collect();
                k.size_rule = Some(LoadedRule { rows, ranges });
            }
            k.specializations = specializations.to_vec();
            shared[i] = Some(Arc::new(k));
            progress = true;
        }
        if slots.iter().all(Option::is_none) {
            break;
        }
        if !progress {
            let stuck = slots
                .iter()
                .flatten()
                .map(|k| k.meta.name.as_str())
                .collect::<Vec<_>>();
            return Err(bad(format!(
                "kernels naming each other in a cycle: {}",
                stuck.join(", ")
            )));
        }
    }
    Ok(shared.into_iter().flatten().collect())
}
