//! Whether a CUDA driver is present, and which CUDA version it supports, without touching a GPU:
//! used by `doctor` and to explain PTX that a driver cannot JIT.

use crate::error::with_sources;

/// The CUDA version of the installed driver (e.g. 13.0), or why there is none.
pub fn driver_cuda_version() -> Result<(i32, i32), String> {
    // SAFETY: libcuda's initializers have no preconditions; cuDriverGetVersion needs no cuInit.
    let lib = unsafe { libloading::Library::new("libcuda.so.1") }
        .map_err(|e| format!("no CUDA driver (libcuda.so.1): {}", with_sources(&e)))?;
    type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
    // SAFETY: declared in cuda.h as CUresult cuDriverGetVersion(int*).
    let f = unsafe { lib.get::<GetVersion>(b"cuDriverGetVersion") }.map_err(|e| {
        format!(
            "libcuda.so.1 has no cuDriverGetVersion: {}",
            with_sources(&e)
        )
    })?;
    let mut v = 0;
    // SAFETY: out-pointer to a live local.
    let rc = unsafe { f(&mut v) };
    if rc != 0 {
        return Err(format!("cuDriverGetVersion failed with CUresult {rc}"));
    }
    Ok((v / 1000, (v % 1000) / 10))
}

/// `cuFuncGetParamInfo(function, index, &offset, &size)`, as declared in cuda.h.
pub(crate) type ParamInfo = unsafe extern "C" fn(
    cudarc::driver::sys::CUfunction,
    usize,
    *mut usize,
    *mut usize,
) -> std::ffi::c_int;

/// `cuFuncGetParamCount(function, &count)`, as declared in cuda.h.
pub(crate) type ParamCount =
    unsafe extern "C" fn(cudarc::driver::sys::CUfunction, *mut usize) -> std::ffi::c_int;

/// What the driver can say about a kernel's parameters: `info` from CUDA 12.4 drivers on, `count`
/// from newer ones (CUDA 13.2 headers declare it). Looked up by name rather than through cudarc,
/// whose dynamic loading panics on a missing symbol.
pub(crate) struct ParamQueries {
    pub info: ParamInfo,
    pub count: Option<ParamCount>,
}

/// The driver's parameter queries, looked up once; `None` for a driver older than 12.4, whose
/// images are then loaded without the parameter check.
pub(crate) fn param_queries() -> Option<&'static ParamQueries> {
    static FOUND: std::sync::OnceLock<Option<(libloading::Library, ParamQueries)>> =
        std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            // SAFETY: as in driver_cuda_version.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }.ok()?;
            // SAFETY: the declared types of both functions; the library stays loaded with them.
            let info = *unsafe { lib.get::<ParamInfo>(b"cuFuncGetParamInfo") }.ok()?;
            let count = unsafe { lib.get::<ParamCount>(b"cuFuncGetParamCount") }
                .ok()
                .map(|f| *f);
            Some((lib, ParamQueries { info, count }))
        })
        .as_ref()
        .map(|(_, q)| q)
}

/// Can a driver supporting CUDA `driver` JIT PTX that needs CUDA `needed` ("13.0")?
pub fn driver_can_jit(driver: (i32, i32), needed: &str) -> Option<bool> {
    let (maj, min) = needed.split_once('.')?;
    let needed = (maj.parse::<i32>().ok()?, min.parse::<i32>().ok()?);
    Some(driver >= needed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jit_needs_a_driver_at_least_as_new_as_the_isa() {
        assert_eq!(driver_can_jit((13, 0), "13.0"), Some(true));
        assert_eq!(driver_can_jit((12, 9), "13.0"), Some(false));
        assert_eq!(driver_can_jit((13, 0), "13.5"), Some(false));
        assert_eq!(driver_can_jit((13, 0), "bad"), None);
    }
}
