//! Where NVRTC is looked for, in order: the override, the environment the running binary was
//! installed into (the `mla-gen-cli` wheel's NVRTC dependency lands there), CUDA toolkits, the
//! site-packages of Python, then the system loader.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Candidate, ENV_OVERRIDE, ENV_PYTHON};

pub(super) const LIB_NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// Inside a site-packages folder: the nvidia-cuda-nvrtc (13.x) and nvidia-cuda-nvrtc-cu12 (12.x)
/// wheels' library folders.
const PIP_LIB_DIRS: [&str; 2] = ["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"];

fn lib_in(dir: &Path) -> Option<PathBuf> {
    LIB_NAMES.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// The package folders of the environment a binary at `exe` was installed into by pip. pip puts
/// scripts in `<prefix>/bin` and packages in `<prefix>/lib/python3.X/site-packages` for a venv,
/// `--user` (`~/.local`), `--prefix`, conda and pyenv alike (`lib64` where the platform's
/// platlib is there, `dist-packages` on Debian's system Python); `--target DIR` puts both
/// straight into DIR (`DIR/bin`, `DIR/nvidia`). No activated venv and no `python3` needed.
pub(super) fn installed_with(exe: &Path) -> Vec<PathBuf> {
    let Some(prefix) = exe.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let mut dirs = glob_python_dirs(&prefix.join("lib"));
    dirs.extend(glob_python_dirs(&prefix.join("lib64")));
    // The `--target` layout only where it is one: elsewhere (cargo's target/, ~/.cargo) a
    // `<prefix>/nvidia` line in every search list would only be noise.
    if prefix.join("nvidia").is_dir() {
        dirs.push(prefix.to_path_buf());
    }
    dirs
}

/// Site-packages folders of the Python that pip installs into, plus the usual user and virtualenv
/// places. Asking the interpreter is the only reliable way across pyenv, venvs and distributions.
fn python_site_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let python = std::env::var(ENV_PYTHON).unwrap_or_else(|_| "python3".to_string());
    let probe =
        "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
    if let Ok(out) = Command::new(&python)
        .args(["-I", "-c", probe])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        if out.status.success() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                dirs.push(PathBuf::from(line.trim()));
            }
        }
    }
    if let Ok(venv) = std::env::var("VIRTUAL_ENV") {
        dirs.extend(glob_python_dirs(&Path::new(&venv).join("lib")));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.extend(glob_python_dirs(&Path::new(&home).join(".local/lib")));
        // Where scripts/install-nvrtc.sh puts NVRTC when the system Python is externally
        // managed (PEP 668).
        dirs.extend(glob_python_dirs(
            &Path::new(&home).join(".local/share/mla-gen/nvrtc-venv/lib"),
        ));
    }
    dirs.extend(glob_python_dirs(Path::new("/usr/local/lib")));
    dirs.extend(glob_python_dirs(Path::new("/usr/lib")));
    dirs
}

/// `<lib>/python3.*/{site,dist}-packages`, sorted so the search order is stable.
fn glob_python_dirs(lib: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(lib) {
        let mut names: Vec<_> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        names.sort();
        for p in names {
            out.push(p.join("site-packages"));
            out.push(p.join("dist-packages"));
        }
    }
    out
}

/// The search list, each folder once (the first label that names it wins; a venv's `lib64` is a
/// link to its `lib`, so folders compare by their real paths).
struct Places {
    list: Vec<Candidate>,
    real_dirs: Vec<PathBuf>,
}

impl Places {
    fn dir(&mut self, label: &str, dir: PathBuf) {
        let real = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
        if self.real_dirs.contains(&real) {
            return;
        }
        self.list.push(Candidate {
            place: format!("{label}{}", dir.display()),
            found: lib_in(&dir),
        });
        self.real_dirs.push(real);
    }

    fn site_packages(&mut self, label: &str, sites: Vec<PathBuf>) {
        for site in sites {
            for sub in PIP_LIB_DIRS {
                self.dir(label, site.join(sub));
            }
        }
    }
}

/// Every place NVRTC is looked for, in order, with what was found.
pub fn candidates() -> Vec<Candidate> {
    candidates_for(std::env::current_exe().ok().as_deref())
}

/// [`candidates`] for a binary at `exe` (the running one; on Linux its real path, symlinks such
/// as pipx's `~/.local/bin/mla-gen` resolved).
pub(super) fn candidates_for(exe: Option<&Path>) -> Vec<Candidate> {
    if let Some(v) = std::env::var_os(ENV_OVERRIDE) {
        let p = PathBuf::from(&v);
        let found = if p.is_dir() {
            lib_in(&p)
        } else {
            p.is_file().then(|| p.clone())
        };
        // An explicit override is final: falling back would hide a typo.
        return vec![Candidate {
            place: format!("{ENV_OVERRIDE}={}", p.display()),
            found,
        }];
    }
    let mut places = Places {
        list: Vec::new(),
        real_dirs: Vec::new(),
    };
    // The NVRTC pip installed with this binary (the wheel pins it) comes before any other.
    if let Some(exe) = exe {
        places.site_packages("installed with mla-gen: ", installed_with(exe));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            let root = PathBuf::from(root);
            for sub in ["lib64", "lib"] {
                places.dir(&format!("{var}: "), root.join(sub));
            }
        }
    }
    places.dir("", PathBuf::from("/usr/local/cuda/lib64"));
    places.site_packages("pip: ", python_site_dirs());
    let mut list = places.list;
    list.push(Candidate {
        place: format!("system loader ({})", LIB_NAMES.join(", ")),
        found: None, // resolved in `load` by dlopen of the bare names
    });
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake libnvrtc under `root/rel`, and a binary at `root/bin/mla-gen`.
    fn layout(root: &Path, rel: &str) -> (PathBuf, PathBuf) {
        let lib_dir = root.join(rel);
        std::fs::create_dir_all(&lib_dir).unwrap();
        std::fs::write(lib_dir.join("libnvrtc.so.13"), b"").unwrap();
        std::fs::create_dir_all(root.join("bin")).unwrap();
        let exe = root.join("bin/mla-gen");
        std::fs::write(&exe, b"").unwrap();
        (exe, lib_dir)
    }

    /// Where the search finds the fake library: at a place of the binary's environment, before
    /// every other place.
    fn found_first(cands: &[Candidate], lib_dir: &Path) -> bool {
        let at = cands
            .iter()
            .position(|c| c.found.as_deref() == Some(&lib_dir.join("libnvrtc.so.13")));
        at.is_some_and(|i| {
            cands[..=i]
                .iter()
                .all(|c| c.place.starts_with("installed with mla-gen: "))
        })
    }

    #[test]
    fn a_venv_binary_finds_the_nvrtc_pip_installed_beside_it_first() {
        let tmp = tempfile::tempdir().unwrap();
        let (exe, lib_dir) = layout(tmp.path(), "lib/python3.12/site-packages/nvidia/cu13/lib");
        assert_eq!(
            installed_with(&exe),
            vec![
                tmp.path().join("lib/python3.12/site-packages"),
                tmp.path().join("lib/python3.12/dist-packages")
            ]
        );
        let cands = candidates_for(Some(&exe));
        if std::env::var_os(ENV_OVERRIDE).is_some() {
            assert_eq!(cands.len(), 1, "the override is final");
            return;
        }
        assert!(found_first(&cands, &lib_dir), "{:#?}", &cands[..3]);
        assert!(cands.last().unwrap().place.starts_with("system loader"));
    }

    #[cfg(unix)]
    #[test]
    fn a_venv_lib64_link_to_lib_is_listed_once() {
        let tmp = tempfile::tempdir().unwrap();
        let (exe, lib_dir) = layout(tmp.path(), "lib/python3.12/site-packages/nvidia/cu13/lib");
        std::os::unix::fs::symlink("lib", tmp.path().join("lib64")).unwrap();
        let cands = candidates_for(Some(&exe));
        let hits = cands
            .iter()
            .filter(|c| {
                c.found
                    .as_deref()
                    .is_some_and(|p| p.starts_with(tmp.path()))
            })
            .count();
        if std::env::var_os(ENV_OVERRIDE).is_none() {
            assert_eq!(hits, 1, "{cands:#?}");
            assert!(found_first(&cands, &lib_dir));
        }
    }

    #[test]
    fn target_and_lib64_layouts_are_searched() {
        let tmp = tempfile::tempdir().unwrap();
        let (exe, lib_dir) = layout(tmp.path(), "nvidia/cuda_nvrtc/lib");
        assert_eq!(installed_with(&exe), vec![tmp.path().to_path_buf()]);
        let lib64 = tempfile::tempdir().unwrap();
        let (exe64, _) = layout(
            lib64.path(),
            "lib64/python3.9/site-packages/nvidia/cu13/lib",
        );
        assert_eq!(
            installed_with(&exe64)[0],
            lib64.path().join("lib64/python3.9/site-packages")
        );
        if std::env::var_os(ENV_OVERRIDE).is_none() {
            assert!(found_first(&candidates_for(Some(&exe)), &lib_dir));
        }
    }

    #[test]
    fn a_binary_outside_any_python_prefix_adds_no_place() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("debug")).unwrap();
        assert!(installed_with(&tmp.path().join("debug/mla-gen")).is_empty());
        assert!(installed_with(Path::new("mla-gen")).is_empty());
        let places: Vec<String> = candidates_for(None).into_iter().map(|c| c.place).collect();
        let unique: std::collections::HashSet<&String> = places.iter().collect();
        assert_eq!(
            unique.len(),
            places.len(),
            "a folder is listed once: {places:#?}"
        );
    }
}
