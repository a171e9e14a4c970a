//! NVRTC, loaded at run time from an explicit search list, behind a small safe wrapper.
//!
//! cudarc's NVRTC loader only tries library names on the system loader path and panics when none
//! loads; a build tool must also look in CUDA_HOME and the pip wheels' folders and fail with a
//! typed error that says where it looked, so this module binds the dozen entry points itself.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod locate;
use crate::error::with_sources;
pub use locate::candidates;
use locate::LIB_NAMES;

/// The NVRTC the project is tested with: PTX ISA 9.0, which CUDA 13.0 drivers (r580) JIT.
pub const PINNED_PIP_PACKAGE: &str = "nvidia-cuda-nvrtc==13.0.88";
pub const INSTALL_COMMAND: &str = "python3 -m pip install nvidia-cuda-nvrtc==13.0.88";
/// Environment variable: a libnvrtc file, or a folder holding one. When set, nothing else is tried.
pub const ENV_OVERRIDE: &str = "MLA_GEN_NVRTC";
/// Environment variable: the Python interpreter asked for its site-packages folders.
pub const ENV_PYTHON: &str = "MLA_GEN_PYTHON";

#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NvrtcError {
    #[error(
        "NVRTC (libnvrtc) not found. Looked in:\n{}\nInstall the pinned NVRTC with:\n    {INSTALL_COMMAND}\nor point {ENV_OVERRIDE} at a libnvrtc.so file or its folder.",
        .searched.iter().map(|s| format!("  - {s}")).collect::<Vec<_>>().join("\n")
    )]
    NotFound { searched: Vec<String> },
    #[error("{path}: cannot load NVRTC: {detail}")]
    Load { path: String, detail: String },
    #[error("NVRTC call {call} failed: {message}")]
    Call { call: &'static str, message: String },
    #[error("NVRTC {version} cannot compile for {arch}; it supports {supported}. A newer NVRTC may support it ({upgrade}); or drop {arch} from {named_in}.")]
    UnsupportedArch {
        version: String,
        arch: String,
        supported: String,
        /// Where the arch was named: "the spec", `--arch`, `MLA_GEN_ARCH`, ...
        named_in: String,
        /// How to get a newer NVRTC: the pinned one where the loaded one is older.
        upgrade: String,
    },
}

type NvrtcResult = c_int;
type Program = *mut std::ffi::c_void;

/// The NVRTC entry points mla-gen uses, bound from one loaded library.
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    get_num_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    get_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    create_program: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile_program: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    destroy_program: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    get_program_log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_program_log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    get_cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    // Keep the function pointers above valid.
    _lib: libloading::Library,
    _builtins: Vec<libloading::Library>,
}

/// A loaded NVRTC.
#[non_exhaustive]
pub struct Nvrtc {
    api: Api,
    /// Where it was loaded from (shown by `doctor`; never written into artifacts).
    pub path: String,
    pub major: i32,
    pub minor: i32,
    /// Architectures it can target, as compute capabilities (e.g. 90).
    pub supported_archs: Vec<i32>,
}

/// One place the locator looked, and what it found there.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Candidate {
    pub place: String,
    pub found: Option<PathBuf>,
}

fn load_symbol<T: Copy>(
    lib: &libloading::Library,
    path: &str,
    name: &str,
) -> Result<T, NvrtcError> {
    // SAFETY: each symbol is read with the signature of its declaration in nvrtc.h.
    unsafe {
        lib.get::<T>(name.as_bytes())
            .map(|s| *s)
            .map_err(|e| NvrtcError::Load {
                path: path.to_string(),
                detail: format!("missing symbol {name}: {}", with_sources(&e)),
            })
    }
}

/// libnvrtc dlopens `libnvrtc-builtins.so.X.Y` by bare name at its first compile, which fails
/// unless that folder is on the loader path (never the case for pip wheels). Loading it first
/// from libnvrtc's own folder makes that later dlopen find it by soname.
fn preload_builtins(nvrtc_path: &Path) -> Vec<libloading::Library> {
    let Some(dir) = nvrtc_path.parent().filter(|d| !d.as_os_str().is_empty()) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with("libnvrtc-builtins.so.") && !n.contains(".alt.")
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        // SAFETY: a shared library with no initializer preconditions.
        .filter_map(|p| unsafe { libloading::Library::new(p) }.ok())
        .collect()
}

fn open(path: &str) -> Result<Nvrtc, NvrtcError> {
    let builtins = preload_builtins(Path::new(path));
    // SAFETY: loading libnvrtc runs its initializers, which have no preconditions.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| NvrtcError::Load {
        path: path.to_string(),
        detail: with_sources(&e),
    })?;
    let api = Api {
        version: load_symbol(&lib, path, "nvrtcVersion")?,
        get_num_supported_archs: load_symbol(&lib, path, "nvrtcGetNumSupportedArchs")?,
        get_supported_archs: load_symbol(&lib, path, "nvrtcGetSupportedArchs")?,
        create_program: load_symbol(&lib, path, "nvrtcCreateProgram")?,
        compile_program: load_symbol(&lib, path, "nvrtcCompileProgram")?,
        destroy_program: load_symbol(&lib, path, "nvrtcDestroyProgram")?,
        get_program_log_size: load_symbol(&lib, path, "nvrtcGetProgramLogSize")?,
        get_program_log: load_symbol(&lib, path, "nvrtcGetProgramLog")?,
        get_ptx_size: load_symbol(&lib, path, "nvrtcGetPTXSize")?,
        get_ptx: load_symbol(&lib, path, "nvrtcGetPTX")?,
        get_cubin_size: load_symbol(&lib, path, "nvrtcGetCUBINSize")?,
        get_cubin: load_symbol(&lib, path, "nvrtcGetCUBIN")?,
        get_error_string: load_symbol(&lib, path, "nvrtcGetErrorString")?,
        _lib: lib,
        _builtins: builtins,
    };
    let mut nvrtc = Nvrtc {
        api,
        path: path.to_string(),
        major: 0,
        minor: 0,
        supported_archs: Vec::new(),
    };
    let (mut major, mut minor) = (0, 0);
    // SAFETY: out-pointers to live locals.
    nvrtc.check("nvrtcVersion", unsafe {
        (nvrtc.api.version)(&mut major, &mut minor)
    })?;
    nvrtc.major = major;
    nvrtc.minor = minor;
    let mut n = 0;
    // SAFETY: as above; the array is sized by the count NVRTC reports.
    nvrtc.check("nvrtcGetNumSupportedArchs", unsafe {
        (nvrtc.api.get_num_supported_archs)(&mut n)
    })?;
    let mut archs = vec![0; n.max(0) as usize];
    nvrtc.check("nvrtcGetSupportedArchs", unsafe {
        (nvrtc.api.get_supported_archs)(archs.as_mut_ptr())
    })?;
    nvrtc.supported_archs = archs;
    Ok(nvrtc)
}

/// Find and load NVRTC, once per process. A failure is remembered too (its message names the
/// places searched or the file that would not load).
pub fn load() -> Result<&'static Nvrtc, NvrtcError> {
    static LOADED: OnceLock<Result<Nvrtc, NvrtcError>> = OnceLock::new();
    let result = LOADED.get_or_init(|| {
        let cands = candidates();
        if let Some(path) = cands.iter().find_map(|c| c.found.as_ref()) {
            return open(&path.to_string_lossy());
        }
        if std::env::var_os(ENV_OVERRIDE).is_none() {
            for name in LIB_NAMES {
                if let Ok(n) = open(name) {
                    return Ok(n);
                }
            }
        }
        Err(NvrtcError::NotFound {
            searched: cands.into_iter().map(|c| c.place).collect(),
        })
    });
    result.as_ref().map_err(NvrtcError::clone)
}

/// The output of one compilation.
#[non_exhaustive]
pub struct Compiled {
    pub ptx: Option<Vec<u8>>,
    pub cubin: Option<Vec<u8>>,
    pub log: String,
}

/// A failed compilation: the log, for the caller to show with the source.
#[non_exhaustive]
pub struct CompileFailure {
    pub log: String,
    pub message: String,
}

impl Nvrtc {
    pub fn version(&self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    fn error_string(&self, code: NvrtcResult) -> String {
        // SAFETY: NVRTC returns a static NUL-terminated string for any code.
        let ptr = unsafe { (self.api.get_error_string)(code) };
        if ptr.is_null() {
            return format!("error {code}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, call: &'static str, code: NvrtcResult) -> Result<(), NvrtcError> {
        if code == 0 {
            Ok(())
        } else {
            Err(NvrtcError::Call {
                call,
                message: self.error_string(code),
            })
        }
    }

    /// Refuse an architecture this NVRTC cannot target, before compiling anything; `named_in`
    /// says where the arch came from (the spec, `--arch`, `MLA_GEN_ARCH`), for the message.
    pub fn check_arch(
        &self,
        compute_capability: u32,
        arch_name: &str,
        named_in: &str,
    ) -> Result<(), NvrtcError> {
        if self.supported_archs.contains(&(compute_capability as i32)) {
            return Ok(());
        }
        Err(unsupported_arch(
            (self.major, self.minor),
            &self.supported_archs,
            arch_name,
            named_in,
        ))
    }

    /// Compile `source` with `options`; fetch PTX and/or CUBIN.
    pub fn compile(
        &self,
        program_name: &str,
        source: &str,
        options: &[String],
        want_ptx: bool,
        want_cubin: bool,
    ) -> Result<Result<Compiled, CompileFailure>, NvrtcError> {
        let to_c = |s: &str| {
            CString::new(s).map_err(|_| NvrtcError::Call {
                call: "nvrtcCreateProgram",
                message: "source or option contains a NUL byte".to_string(),
            })
        };
        let src = to_c(source)?;
        let name = to_c(program_name)?;
        let opts: Vec<CString> = options.iter().map(|o| to_c(o)).collect::<Result<_, _>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid C strings; no headers.
        self.check("nvrtcCreateProgram", unsafe {
            (self.api.create_program)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        let guard = ProgramGuard { nvrtc: self, prog };
        // SAFETY: `prog` is live; options outlive the call.
        let compile_code =
            unsafe { (self.api.compile_program)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = self.read(
            prog,
            "nvrtcGetProgramLog",
            self.api.get_program_log_size,
            self.api.get_program_log,
        )?;
        let log =
            String::from_utf8_lossy(log.split(|&b| b == 0).next().unwrap_or(&[])).into_owned();
        if compile_code != 0 {
            drop(guard);
            return Ok(Err(CompileFailure {
                log,
                message: self.error_string(compile_code),
            }));
        }
        let ptx = if want_ptx {
            let mut p = self.read(prog, "nvrtcGetPTX", self.api.get_ptx_size, self.api.get_ptx)?;
            // PTX comes NUL-terminated; files hold the text alone.
            while p.last() == Some(&0) {
                p.pop();
            }
            Some(p)
        } else {
            None
        };
        let cubin = if want_cubin {
            Some(self.read(
                prog,
                "nvrtcGetCUBIN",
                self.api.get_cubin_size,
                self.api.get_cubin,
            )?)
        } else {
            None
        };
        drop(guard);
        Ok(Ok(Compiled { ptx, cubin, log }))
    }

    fn read(
        &self,
        prog: Program,
        call: &'static str,
        size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
        get: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ) -> Result<Vec<u8>, NvrtcError> {
        let mut n = 0usize;
        // SAFETY: `prog` is live; the buffer is sized by NVRTC's own count.
        self.check(call, unsafe { size(prog, &mut n) })?;
        let mut buf = vec![0u8; n];
        if n > 0 {
            self.check(call, unsafe { get(prog, buf.as_mut_ptr().cast()) })?;
        }
        Ok(buf)
    }
}

struct ProgramGuard<'a> {
    nvrtc: &'a Nvrtc,
    prog: Program,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        unsafe {
            (self.nvrtc.api.destroy_program)(&mut self.prog);
        }
    }
}

// NVRTC's API is thread-safe for distinct programs; the loaded library is shared read-only.
unsafe impl Send for Nvrtc {}
unsafe impl Sync for Nvrtc {}

/// The major and minor version of [`PINNED_PIP_PACKAGE`] (13.0 for `==13.0.88`).
fn pinned_version() -> Option<(i32, i32)> {
    let (_, version) = PINNED_PIP_PACKAGE.split_once("==")?;
    let mut parts = version.split('.').map(|p| p.parse::<i32>().ok());
    Some((parts.next()??, parts.next()??))
}

/// The refusal of `arch` by an NVRTC of `version`. Installing the pinned NVRTC helps only when
/// the loaded one is older: never tell to install the version already there.
fn unsupported_arch(
    version: (i32, i32),
    supported: &[i32],
    arch: &str,
    named_in: &str,
) -> NvrtcError {
    let upgrade = match pinned_version() {
        Some(pinned) if version < pinned => format!("the pinned one: {INSTALL_COMMAND}"),
        _ => format!("point {ENV_OVERRIDE} at one"),
    };
    NvrtcError::UnsupportedArch {
        version: format!("{}.{}", version.0, version.1),
        arch: arch.to_string(),
        supported: supported
            .iter()
            .map(|a| format!("sm_{a}"))
            .collect::<Vec<_>>()
            .join(", "),
        named_in: named_in.to_string(),
        upgrade,
    }
}

/// The PTX ISA version a PTX file declares (`.version 9.0`).
pub fn ptx_isa(ptx: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(ptx);
    text.lines()
        .find_map(|l| l.trim().strip_prefix(".version "))
        .map(|v| v.trim().to_string())
}

/// The full toolkit release NVRTC stamps into PTX (`Cuda compilation tools, release 13.0, V13.0.88`).
pub fn ptx_toolkit_release(ptx: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(ptx);
    text.lines()
        .find(|l| l.contains("Cuda compilation tools"))
        .and_then(|l| l.rsplit(", V").next())
        .map(|v| v.trim().to_string())
}

/// The CUDA release whose driver is the oldest able to JIT a PTX ISA version, and that driver's
/// branch where known (PTX ISA release notes: 8.7 came with CUDA 12.8, 9.0 with CUDA 13.0, and 9.x
/// follows 13.x).
pub fn oldest_driver_for_isa(isa: &str) -> Option<(String, &'static str)> {
    let (major, minor) = isa.split_once('.')?;
    let (major, minor): (u32, u32) = (major.parse().ok()?, minor.parse().ok()?);
    let (cuda, branch) = match (major, minor) {
        (7, 8) => ("11.8".to_string(), "r520"),
        (8, m @ 0..=5) => {
            let branch = ["r525", "r530", "r535", "r545", "r550", "r555"][m as usize];
            (format!("12.{m}"), branch)
        }
        (8, 6) | (8, 7) => ("12.8".to_string(), "r570"),
        (8, 8) => ("12.9".to_string(), "r575"),
        (9, 0) => ("13.0".to_string(), "r580"),
        (9, m) => (format!("13.{m}"), ""),
        _ => return None,
    };
    Some((cuda, branch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isa_maps_to_the_driver_that_first_shipped_it() {
        assert_eq!(oldest_driver_for_isa("9.0"), Some(("13.0".into(), "r580")));
        assert_eq!(oldest_driver_for_isa("8.5"), Some(("12.5".into(), "r555")));
        assert_eq!(
            oldest_driver_for_isa("9.5").map(|x| x.0),
            Some("13.5".into())
        );
        assert_eq!(oldest_driver_for_isa("x"), None);
    }

    #[test]
    fn an_unsupported_arch_names_its_origin_and_never_the_installed_nvrtc() {
        assert_eq!(pinned_version(), Some((13, 0)));
        let at_pin = unsupported_arch((13, 0), &[80, 90], "sm_99", "--arch").to_string();
        assert_eq!(
            at_pin,
            "NVRTC 13.0 cannot compile for sm_99; it supports sm_80, sm_90. A newer NVRTC may support it (point MLA_GEN_NVRTC at one); or drop sm_99 from --arch."
        );
        let old = unsupported_arch((12, 4), &[80, 90], "sm_100", "the spec").to_string();
        assert!(
            old.contains(&format!(
                "(the pinned one: {INSTALL_COMMAND}); or drop sm_100 from the spec."
            )),
            "{old}"
        );
        let env = unsupported_arch((13, 1), &[90], "sm_99", "MLA_GEN_ARCH").to_string();
        assert!(!env.contains(INSTALL_COMMAND), "{env}");
        assert!(env.ends_with("drop sm_99 from MLA_GEN_ARCH."), "{env}");
    }

    #[test]
    fn ptx_header_fields_are_read() {
        let ptx = b"//\n// Cuda compilation tools, release 13.0, V13.0.88\n//\n.version 9.0\n.target sm_90\n";
        assert_eq!(ptx_isa(ptx).as_deref(), Some("9.0"));
        assert_eq!(ptx_toolkit_release(ptx).as_deref(), Some("13.0.88"));
    }
}
