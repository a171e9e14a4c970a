//! Step 7 of the check for one tensor (docs/MANIFEST.md, "The check"): alignment, strides,
//! extent within its buffer, and no two elements at one address where the kernel writes.

use super::{ParamPlan, Plan, Refusal, Resolved, TensorPlan};

impl Plan {
    /// Step 7 for one tensor; its extent in elements.
    pub(super) fn check_tensor(
        &self,
        p: &ParamPlan,
        t: &TensorPlan,
        ptr: u64,
        len: u64,
        ints: &[i64],
    ) -> Result<u64, Refusal> {
        if !divides(t.align_bytes, ptr) {
            return Err(self.refuse(format!(
                "{}: pointer {ptr:#x} is not aligned to {} bytes",
                p.name, t.align_bytes
            )));
        }
        for d in &t.dims {
            if let Some(s) = d.stride.param() {
                if !divides(t.stride_multiple, ints[s].unsigned_abs()) {
                    return Err(self.refuse(format!(
                        "{}: {} = {} is not a multiple of {} elements (the kernel's {}-byte access)",
                        p.name, self.params[s].name, ints[s], t.stride_multiple, t.align_bytes
                    )));
                }
            }
        }
        let mut dims = [(0i64, 0i64); 8];
        for (slot, d) in dims.iter_mut().zip(&t.dims) {
            let size = d.size.eval(ints);
            let stride = d.stride.eval(ints);
            let (Some(size), Some(stride)) = (size, stride) else {
                return Err(self.refuse(format!(
                    "{}: {} overflows 64 bits",
                    p.name,
                    shape(t, ints)
                )));
            };
            *slot = (size, stride);
        }
        let dims = &dims[..t.dims.len()];
        if dims.iter().any(|&(size, _)| size == 0) {
            return Ok(0);
        }
        let extent = dims.iter().try_fold(1i64, |acc, &(size, stride)| {
            (size - 1)
                .checked_mul(stride)
                .and_then(|x| x.checked_add(acc))
        });
        let Some(extent) = extent else {
            return Err(self.refuse(format!("{}: {} overflows 64 bits", p.name, shape(t, ints))));
        };
        if extent as u64 > len {
            return Err(self.refuse(format!(
                "{}: {} needs {extent} elements, it has {len}",
                p.name,
                shape(t, ints)
            )));
        }
        if t.distinct {
            // Innermost (smallest stride) first: each dimension must step past everything
            // the dimensions inside it cover.
            let mut order = [(0i64, 0i64); 8];
            let mut k = 0;
            for &(size, stride) in dims.iter().filter(|&&(size, _)| size > 1) {
                order[k] = (stride, size);
                k += 1;
            }
            let order = &mut order[..k];
            order.sort_by_key(|&(stride, _)| stride);
            let mut span = 1i64;
            for &(stride, size) in order.iter() {
                if stride < span {
                    return Err(self.refuse(format!(
                        "{}: {} maps two elements to one address",
                        p.name,
                        shape(t, ints)
                    )));
                }
                span += (size - 1) * stride;
            }
        }
        Ok(extent as u64)
    }
}

/// `m` (>= 1) divides `v`; a power of two (every alignment the generator writes) by its low
/// bits, as a division costs a launch tens of cycles.
pub(super) fn divides(m: u64, v: u64) -> bool {
    if m.is_power_of_two() {
        v & (m - 1) == 0
    } else {
        v % m == 0
    }
}

/// `[T=4, H=2, D=128] with strides (256, 128, 1)` for messages.
fn shape(t: &TensorPlan, ints: &[i64]) -> String {
    let show = |e: &Resolved| {
        e.eval(ints)
            .map_or_else(|| e.text.clone(), |v| v.to_string())
    };
    let dims: Vec<String> = t
        .dims
        .iter()
        .map(|d| format!("{}={}", d.label, show(&d.size)))
        .collect();
    let strides: Vec<String> = t.dims.iter().map(|d| show(&d.stride)).collect();
    format!(
        "[{}] with strides ({})",
        dims.join(", "),
        strides.join(", ")
    )
}
