//! The check's memo of the last call that passed (as the C launcher's prepared plans,
//! templates/c/mla_prepared.c.tera): a call that differs from it only in its buffers' addresses
//! is checked for what addresses decide, alignment (step 7's first rule) and overlap (step 8).
//! Any other call, and any call that fails those, gets the full check, so a refusal is always
//! the full check's.

use std::sync::Mutex;

use super::tensor::divides;
use super::{Checked, ParamKind, Plan, MAX_PARAMS};

/// What steps 3-7 of the check read of a call, but its addresses: the integers given, the
/// buffers' lengths, and which buffers are null and which integers defaulted. (Constants passed
/// are not in it: a call that passes one is not memoized.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) ints: [i64; MAX_PARAMS],
    pub(super) lens: [u64; MAX_PARAMS],
    /// Bit i: parameter i is a null buffer or an integer left to its default.
    unset: u32,
}

impl Key {
    pub(super) fn unset(&mut self, param: usize) {
        self.unset |= 1 << param;
    }
    pub(super) fn is_unset(&self, param: usize) -> bool {
        self.unset >> param & 1 == 1
    }
}

#[derive(Debug, Clone, Copy)]
struct Passed {
    key: Key,
    checked: Checked,
    /// The bytes each tensor spans from its address, as step 7 found them.
    spans: [u64; MAX_PARAMS],
}

/// One call, behind a lock that a launch never waits for: a busy memo is skipped (the full check
/// runs) so threads launching one kernel do not queue on it.
#[derive(Debug, Default)]
pub(super) struct Memo(Mutex<Option<Passed>>);

/// A copy of a plan starts with an empty memo.
impl Clone for Memo {
    fn clone(&self) -> Memo {
        Memo::default()
    }
}

impl Memo {
    /// What the full check would return for a call of `key` with these addresses, where the
    /// last call that passed had `key` and these addresses pass too; else `None`.
    pub(super) fn reuse(
        &self,
        plan: &Plan,
        key: &Key,
        ptrs: &[u64; MAX_PARAMS],
    ) -> Option<Checked> {
        let last = self.0.try_lock().ok()?;
        let last = last.as_ref().filter(|last| last.key == *key)?;
        let aligned = plan.params.iter().zip(ptrs).all(|(p, &ptr)| {
            p.tensor
                .as_ref()
                .is_none_or(|t| ptr == 0 || divides(t.align_bytes, ptr))
        });
        if !aligned || plan.overlap(ptrs, &last.spans).is_some() {
            return None;
        }
        let mut checked = last.checked;
        for (i, p) in plan.params.iter().enumerate() {
            if p.kind == ParamKind::Pointer {
                checked.values[i] = ptrs[i];
            }
        }
        Some(checked)
    }

    /// Whether a call is kept (for check/tests.rs, compiled with `runtime` only).
    #[cfg(all(test, feature = "runtime"))]
    pub(super) fn holds_a_call(&self) -> bool {
        matches!(self.0.try_lock().as_deref(), Ok(Some(_)))
    }

    /// Remember a call that passed the full check (unless another thread holds the memo).
    pub(super) fn keep(&self, key: Key, checked: Checked, spans: [u64; MAX_PARAMS]) {
        if let Ok(mut last) = self.0.try_lock() {
            *last = Some(Passed {
                key,
                checked,
                spans,
            });
        }
    }
}
