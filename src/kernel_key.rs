//! The options that select a kernel of a family at run time, beside the variant types they are
//! made of ([`crate::variant`]): what a generated module's `dispatch` matches on and
//! `Runtime::dispatch` searches for. The schedule is not part of it.

use crate::dtype::Dtype;
use crate::variant::{Fp8Group, LseLayout, OutputKind};

/// The options that select a kernel of a family at run time (what a generated module's
/// `dispatch` matches on); the schedule is not part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelKey {
    MergeAttnStates {
        dtype: Dtype,
        head_size: u32,
        output: OutputKind,
        /// With `output: Fp8E4m3Group`.
        fp8_group: Option<Fp8Group>,
        prefix_threshold: bool,
        output_lse: bool,
        lse_layout: LseLayout,
        /// Takes the requests' start locations and fuses the empty-context lse mask.
        mask_empty_context: bool,
    },
    MergeStates {
        dtype: Dtype,
        head_size: u32,
        /// `None`: K is a launch argument.
        num_states: Option<u32>,
        output_lse: bool,
    },
    MergeStateInPlace {
        dtype: Dtype,
        head_size: u32,
        mask: bool,
        lse_layout: LseLayout,
    },
    MaskEmptyContextLse {
        lse_layout: LseLayout,
    },
}
