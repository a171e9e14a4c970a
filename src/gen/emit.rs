//! Emit: compiled kernels -> files (sources, PTX, CUBIN) and `manifest.json`, written atomically;
//! and `check`, which compares a directory with what generation would write.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::constants::{TOOL_NAME, TOOL_VERSION};
use crate::gen::abi::{self, Launch, Param};
use crate::gen::compile::{CompiledKernel, Resources};
use crate::gen::nvrtc::{self, Nvrtc};
use crate::gen::render::Templates;
use crate::gen::sha256_hex;
use crate::gen::spec::{MergeVariant, Spec};

pub const KERNEL_DIR: &str = "kernels";
pub use crate::contract::{MANIFEST, SCHEMA_VERSION};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmitError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{path} is not empty and holds no {MANIFEST} written by mla-gen, so it is not an mla-gen output folder; refusing to replace it. Choose an empty or new folder with --out.")]
    NotOurs { path: PathBuf },
    #[error("{path} is the folder this command runs in (or holds it): it is replaced as a whole, which would leave the shell in a deleted folder. Run from its parent, e.g. `cd .. && mla-gen generate --out <name>`.")]
    InsideOutput { path: PathBuf },
    #[error("cannot serialize the manifest: {0}")]
    Json(#[from] serde_json::Error),
}

/// Map an I/O error to `EmitError::Io` naming the path and what failed.
pub(crate) fn io_err<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(io::Error) -> EmitError + 'a {
    move |source| EmitError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

// ---- manifest ----

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Manifest {
    pub schema_version: u32,
    pub generator: Generator,
    pub nvrtc: NvrtcInfo,
    pub spec: SpecInfo,
    pub templates_sha256: String,
    pub kernels: Vec<KernelEntry>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Generator {
    pub name: &'static str,
    pub version: &'static str,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NvrtcInfo {
    /// major.minor from nvrtcVersion.
    pub version: String,
    /// Full release stamped into the PTX (e.g. 13.0.88).
    pub release: String,
    pub ptx_isa: String,
    /// Oldest CUDA driver version able to JIT that PTX.
    pub oldest_driver_cuda: String,
    pub oldest_driver_branch: String,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct SpecInfo {
    pub source: String,
    pub sha256: String,
    pub archs: Vec<String>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct FileRef {
    pub file: String,
    pub bytes: usize,
    pub sha256: String,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ArchEntry {
    pub arch: String,
    pub nvrtc_options: Vec<String>,
    /// Absent where the spec's `ptx = "newest"` left it out (then `cubin` is present).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ptx: Option<FileRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cubin: Option<FileRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

#[derive(Debug, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct KernelEntry {
    pub name: String,
    pub family: &'static str,
    pub variant: MergeVariant,
    /// sha256 of everything that determines this kernel's files: variant, templates, tool and
    /// NVRTC versions, options and archs.
    pub inputs_sha256: String,
    pub short_hash: String,
    /// Every parameter with what a caller must satisfy (docs/MANIFEST.md).
    pub params: Vec<Param>,
    /// Names fixed at generation that a caller may pass and must match.
    pub constants: BTreeMap<String, String>,
    /// Limits on the integer arguments beyond their bounds (docs/MANIFEST.md); absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<crate::contract::Limit>,
    pub launch: Launch,
    /// What selects the kernel beyond its parameters (docs/MANIFEST.md, "Selection").
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub select: BTreeMap<String, String>,
    /// The `.cu` file; absent where the spec says `sources = false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<FileRef>,
    pub archs: Vec<ArchEntry>,
}

/// Files to write, keyed by their path relative to the output folder.
pub type FileSet = BTreeMap<String, Vec<u8>>;

fn file_ref(files: &mut FileSet, rel: String, bytes: Vec<u8>) -> FileRef {
    let r = FileRef {
        file: rel.clone(),
        bytes: bytes.len(),
        sha256: sha256_hex(&bytes),
    };
    files.insert(rel, bytes);
    r
}

/// Everything generation writes, in memory: the files and the manifest that describes them.
pub fn plan(
    spec: &Spec,
    templates: &Templates,
    nvrtc: &Nvrtc,
    kernels: &[CompiledKernel],
) -> Result<(FileSet, Manifest), EmitError> {
    let mut files = FileSet::new();
    let templates_sha256 = templates.sha256();
    let first_ptx = kernels
        .iter()
        .flat_map(|k| &k.archs)
        .find_map(|a| a.ptx.as_deref())
        .unwrap_or(&[]);
    let release = nvrtc::ptx_toolkit_release(first_ptx).unwrap_or_else(|| nvrtc.version());
    let ptx_isa = nvrtc::ptx_isa(first_ptx).unwrap_or_default();
    let (oldest_cuda, branch) = nvrtc::oldest_driver_for_isa(&ptx_isa).unwrap_or_default();

    let mut entries = Vec::with_capacity(kernels.len());
    for k in kernels {
        let mut inputs = serde_json::json!({
            "variant": &k.variant,
            "templates_sha256": &templates_sha256,
            "tool_version": TOOL_VERSION,
            "nvrtc_release": &release,
            "archs": k.archs.iter().map(|a| (a.arch.name(), &a.options)).collect::<Vec<_>>(),
        });
        // Only where some PTX is left out, so the hashes of every `ptx = "every"` spec stay.
        if k.archs.iter().any(|a| a.ptx.is_none()) {
            inputs["ptx_archs"] = k
                .archs
                .iter()
                .filter(|a| a.ptx.is_some())
                .map(|a| a.arch.name())
                .collect();
        }
        let inputs_sha256 = sha256_hex(serde_json::to_string(&inputs)?.as_bytes());
        let source = spec.sources.then(|| {
            file_ref(
                &mut files,
                format!("{KERNEL_DIR}/{}.cu", k.name),
                k.source.clone().into_bytes(),
            )
        });
        let archs = k
            .archs
            .iter()
            .map(|a| {
                let arch = a.arch.name();
                ArchEntry {
                    ptx: a.ptx.clone().map(|p| {
                        file_ref(&mut files, format!("{KERNEL_DIR}/{}.{arch}.ptx", k.name), p)
                    }),
                    cubin: a.cubin.clone().map(|c| {
                        file_ref(
                            &mut files,
                            format!("{KERNEL_DIR}/{}.{arch}.cubin", k.name),
                            c,
                        )
                    }),
                    nvrtc_options: a.options.clone(),
                    resources: a.resources.clone(),
                    arch,
                }
            })
            .collect();
        let contract = abi::contract(&k.variant);
        entries.push(KernelEntry {
            name: k.name.clone(),
            family: k.variant.family.table(),
            variant: k.variant.clone(),
            short_hash: inputs_sha256[..12].to_string(),
            inputs_sha256,
            params: contract.params,
            constants: contract.constants,
            limits: contract.limits,
            launch: Launch::for_variant(&k.variant),
            select: contract.select,
            source,
            archs,
        });
    }
    let manifest = Manifest {
        schema_version: SCHEMA_VERSION,
        generator: Generator {
            name: TOOL_NAME,
            version: TOOL_VERSION,
        },
        nvrtc: NvrtcInfo {
            version: nvrtc.version(),
            release,
            ptx_isa,
            oldest_driver_cuda: oldest_cuda,
            oldest_driver_branch: branch.to_string(),
        },
        spec: SpecInfo {
            source: spec.source_name(),
            sha256: spec.text_sha256.clone(),
            archs: spec.archs.iter().map(|a| a.name()).collect(),
        },
        templates_sha256,
        kernels: entries,
    };
    let mut json = serde_json::to_vec_pretty(&manifest)?;
    json.push(b'\n');
    files.insert(MANIFEST.to_string(), json);
    Ok((files, manifest))
}

// ---- reading a folder back ----

/// Every file under `dir`, relative paths with `/` separators.
pub fn read_tree(dir: &Path) -> Result<FileSet, EmitError> {
    let mut out = FileSet::new();
    if !dir.exists() {
        return Ok(out);
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(io_err(&d, "cannot list"))? {
            let entry = entry.map_err(io_err(&d, "cannot list"))?;
            let path = entry.path();
            let ty = entry.file_type().map_err(io_err(&path, "cannot stat"))?;
            if ty.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(dir)
                    .unwrap_or(&path)
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let bytes = std::fs::read(&path).map_err(io_err(&path, "cannot read"))?;
                out.insert(rel, bytes);
            }
        }
    }
    Ok(out)
}

/// How a folder differs from the planned files.
#[derive(Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diff {
    pub stale: Vec<String>,
    pub missing: Vec<String>,
    pub extra: Vec<String>,
}

impl Diff {
    pub fn is_clean(&self) -> bool {
        self.stale.is_empty() && self.missing.is_empty() && self.extra.is_empty()
    }
}

pub fn diff(planned: &FileSet, actual: &FileSet) -> Diff {
    let mut d = Diff::default();
    for (path, bytes) in planned {
        match actual.get(path) {
            None => d.missing.push(path.clone()),
            Some(b) if b != bytes => d.stale.push(path.clone()),
            Some(_) => {}
        }
    }
    for path in actual.keys() {
        if !planned.contains_key(path) {
            d.extra.push(path.clone());
        }
    }
    d
}

// ---- writing ----

/// What `write` did.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The folder already held exactly these files; nothing was touched.
    Unchanged,
    /// The folder was replaced; counts of files written anew and kept as they were.
    Replaced { written: usize, kept: usize },
}

/// The lock file, in the output folder's parent: one generation per parent folder at a time.
pub const LOCK_FILE: &str = ".mla-gen.lock";

/// Holds an exclusive lock until dropped. Another `generate` into the same parent folder waits.
struct ParentLock {
    _file: std::fs::File,
}

impl ParentLock {
    fn acquire(parent: &Path) -> Result<ParentLock, EmitError> {
        let path = parent.join(LOCK_FILE);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err(&path, "cannot create the lock file"))?;
        // An exclusive advisory lock on every OS std supports (flock on Unix, LockFileEx on
        // Windows); released when the file closes.
        file.lock().map_err(io_err(&path, "cannot lock"))?;
        Ok(ParentLock { _file: file })
    }
}

fn staging_prefix(out: &Path) -> String {
    let name = out
        .file_name()
        .map_or_else(|| "out".to_string(), |n| n.to_string_lossy().into_owned());
    format!(".mla-gen-staging-{name}-")
}

/// Staging folders of this output left by a generation that was killed (we hold the lock, so no
/// live generation owns one).
fn remove_stale_staging(parent: &Path, out: &Path) {
    let prefix = staging_prefix(out);
    if let Ok(entries) = std::fs::read_dir(parent) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// `out` by its real name where it is a folder (`.`, `..` or a path through them), so that its
/// parent is where the staging folder goes; refused where the process runs inside it.
fn resolve_out(out: &Path) -> Result<PathBuf, EmitError> {
    match std::fs::canonicalize(out) {
        Ok(real) if real.is_dir() => {
            let here = std::env::current_dir()
                .ok()
                .and_then(|d| d.canonicalize().ok());
            if here.is_some_and(|h| h.starts_with(&real)) {
                return Err(EmitError::InsideOutput {
                    path: out.to_path_buf(),
                });
            }
            Ok(real)
        }
        _ => Ok(out.to_path_buf()),
    }
}

/// Refuse a file, or a folder of other files, as `out`. The check runs again under the lock,
/// which is what decides, since another generation may replace `out` in between; here a folder
/// with our manifest is not read further, so a large one is read once.
fn refuse_foreign(out: &Path) -> Result<(), EmitError> {
    let ours = std::fs::read(out.join(MANIFEST)).is_ok_and(|m| written_by_mla_gen(&m));
    if !ours {
        existing_tree(out)?;
    }
    Ok(())
}

/// Whether `manifest` is one this tool wrote (its `generator.name`): a `manifest.json` of
/// something else (a web app's, a browser extension's) does not make a folder ours to replace.
fn written_by_mla_gen(manifest: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Generator {
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Head {
        generator: Generator,
    }
    serde_json::from_slice::<Head>(manifest).is_ok_and(|h| h.generator.name == TOOL_NAME)
}

/// The folder that holds `out` (and its staging folder).
fn parent_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Refuse, before minutes of compiling, an `out` that [`write()`] would refuse: the folder the
/// process runs in, a file, a folder of other files, a parent that cannot be created or written.
/// Creates no folder: it probes the nearest existing one of `out`'s parents with a staging
/// folder of its own, then removes that (a parent made and removed here could vanish under a
/// concurrent generation between its `create_dir_all` and its lock).
pub fn check_destination(out: &Path) -> Result<(), EmitError> {
    let out = resolve_out(out)?;
    refuse_foreign(&out)?;
    let parent = parent_of(&out);
    let nearest = parent
        .ancestors()
        .find(|p| p.as_os_str().is_empty() || p.exists())
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let what = if nearest == parent {
        "cannot create a staging folder"
    } else {
        "cannot create folder"
    };
    if !nearest.is_dir() {
        let in_the_way = format!("{} is not a folder", nearest.display());
        return Err(io_err(&parent, "cannot create folder")(io::Error::other(
            in_the_way,
        )));
    }
    tempfile::Builder::new()
        .prefix(&staging_prefix(&out))
        .tempdir_in(nearest)
        .map(drop)
        .map_err(io_err(&parent, what))
}

/// Replace `out` with exactly `files`, atomically: the new tree is staged in a sibling temporary
/// folder, unchanged files are hard-linked from the old tree (their timestamps stay), then the two
/// folders are swapped in one rename. On any error, or if the process is killed, `out` is left as
/// it was. Concurrent calls for folders of one parent run one after the other.
pub fn write(out: &Path, files: &FileSet) -> Result<WriteOutcome, EmitError> {
    let resolved = resolve_out(out)?;
    let out = resolved.as_path();
    let parent = parent_of(out);
    // Before the lock file is created, so that a refused generate leaves nothing behind (the lock
    // file is never removed: unlinking it while others wait on it would let two generations hold
    // the lock at once).
    refuse_foreign(out)?;
    std::fs::create_dir_all(&parent).map_err(io_err(&parent, "cannot create folder"))?;
    let _lock = ParentLock::acquire(&parent)?;
    remove_stale_staging(&parent, out);

    let existing = existing_tree(out)?;
    if let Some(tree) = &existing {
        if diff(files, tree).is_clean() {
            return Ok(WriteOutcome::Unchanged);
        }
    }

    let staging = tempfile::Builder::new()
        .prefix(&staging_prefix(out))
        .tempdir_in(&parent)
        .map_err(io_err(&parent, "cannot create a staging folder"))?;
    let new_root = staging.path().join("new");
    let (mut written, mut kept) = (0, 0);
    for (rel, bytes) in files {
        let dest = new_root.join(rel);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(io_err(dir, "cannot create folder"))?;
        }
        let unchanged = existing
            .as_ref()
            .and_then(|t| t.get(rel))
            .is_some_and(|old| old == bytes);
        if unchanged && std::fs::hard_link(out.join(rel), &dest).is_ok() {
            kept += 1;
            continue;
        }
        std::fs::write(&dest, bytes).map_err(io_err(&dest, "cannot write"))?;
        written += 1;
    }

    if existing.is_some() {
        swap(out, &new_root, &staging.path().join("old"))?;
    } else {
        std::fs::rename(&new_root, out)
            .map_err(io_err(out, "cannot move the new tree into place"))?;
    }
    // Dropping `staging` removes the old tree.
    drop(staging);
    Ok(WriteOutcome::Replaced { written, kept })
}

/// The files of `out` where it is an mla-gen folder (or empty), none where it does not exist; an
/// error where it is not ours to replace.
fn existing_tree(out: &Path) -> Result<Option<FileSet>, EmitError> {
    if !out.exists() {
        return Ok(None);
    }
    if !out.is_dir() {
        return Err(EmitError::Io {
            path: out.to_path_buf(),
            what: "is not a folder",
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        });
    }
    let tree = read_tree(out)?;
    if !tree.is_empty() && !tree.get(MANIFEST).is_some_and(|m| written_by_mla_gen(m)) {
        return Err(EmitError::NotOurs {
            path: out.to_path_buf(),
        });
    }
    Ok(Some(tree))
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ca = CString::new(a.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let cb = CString::new(b.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: two valid NUL-terminated paths; renameat2 does not retain them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Put `new_root` at `out`; the old tree ends up at `old_slot`.
fn swap(out: &Path, new_root: &Path, old_slot: &Path) -> Result<(), EmitError> {
    if exchange(out, new_root).is_ok() {
        // `new_root` now holds the old tree; move it where the staging cleanup removes it.
        return std::fs::rename(new_root, old_slot).map_err(io_err(new_root, "cannot move aside"));
    }
    // Filesystems without RENAME_EXCHANGE: two renames, undoing the first if the second fails.
    std::fs::rename(out, old_slot).map_err(io_err(out, "cannot move the old tree aside"))?;
    if let Err(e) = std::fs::rename(new_root, out) {
        let _ = std::fs::rename(old_slot, out);
        return Err(EmitError::Io {
            path: out.to_path_buf(),
            what: "cannot move the new tree into place",
            source: e,
        });
    }
    Ok(())
}
