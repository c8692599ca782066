//! Full cache (§3.3): every audio position stays on the device, nothing is recalled — the
//! quality upper bound and the reference every lossless test compares against.

use crate::error::Result;
use crate::layout::AudioLayout;

use super::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepObservation, StepPlan,
    StepSignal,
};

/// Keeps everything resident (r_GPU = r_GPU+CPU = 1).
#[derive(Clone, Copy, Debug, Default)]
pub struct FullPolicy;

impl Policy for FullPolicy {
    fn name(&self) -> &str {
        "full"
    }
    fn prefill_signal(&self) -> PrefillSignal {
        PrefillSignal::None
    }
    fn step_signal(&self) -> StepSignal {
        StepSignal::None
    }
    fn unit_len(&self, layout: &AudioLayout) -> usize {
        layout.segment_len()
    }
    fn is_anchor(&self, _head: usize) -> bool {
        false
    }
    fn plan_prefill(&mut self, ctx: &PrefillContext<'_>) -> Result<Vec<HeadPlan>> {
        let t = ctx.layout.audio_len() as u32;
        let plan = HeadPlan { device: (0..t).collect(), exact: true, ..HeadPlan::default() };
        Ok(vec![plan; ctx.layers * ctx.kv_heads])
    }
    fn plan_step(
        &mut self,
        _obs: &StepObservation<'_>,
        _residency: &Residency,
        _plan: &mut StepPlan,
    ) {
    }
}
