//! Per-step and per-run metrics (WnW §3.4 retention, Table 4 runtime).
//!
//! * `r_GPU = N^audio_GPU / (L·H_kv·T_a)`: audio (head, position) pairs resident on the
//!   device — permanent rows plus recalled rows — over the full audio KV.
//! * `r_GPU+CPU = (N^audio_GPU + N^audio_CPU) / (L·H_kv·T_a)` where `N^audio_CPU` counts the
//!   recallable host rows *not currently on the device*: a recalled position is counted once
//!   (on the device), so `r_GPU+CPU` is the share of audio KV that is resident or recallable
//!   and never exceeds 1 (ArkVale's full mirror gives exactly 1, as in §3.6).
//! * bytes H2D: bytes of K and V rows issued for recall this step (the paper's "MB/step" of
//!   CPU→GPU transfer); new tokens' K/V are produced on the device and are not counted.
//! * policy time: wall time of the step's decision and bookkeeping on the calling thread,
//!   excluding the copies (done by the recall worker) and the wait for them.

use std::time::Duration;

use serde::Serialize;

/// Metrics of one decode step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Step index (0-based).
    pub step: u64,
    /// On-device audio retention after this step's decisions.
    pub r_gpu: f64,
    /// Resident-or-recallable audio retention after this step's decisions.
    pub r_gpu_cpu: f64,
    /// Bytes of K/V issued host→device for recall.
    pub bytes_h2d: u64,
    /// Units (segments/pages) recalled.
    pub recalls: u32,
    /// Units released from the device.
    pub releases: u32,
    /// Recalls that failed (allocation or copy); retried when selected again. Failures of
    /// copies issued at step s are reported at step s + 1.
    pub failed_recalls: u32,
    /// Decision and bookkeeping time, excluding copies.
    pub policy_time: Duration,
}

/// Aggregates over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunMetrics {
    /// Policy name.
    pub policy: String,
    /// r_GPU right after prefill.
    pub prefill_r_gpu: f64,
    /// r_GPU+CPU right after prefill.
    pub prefill_r_gpu_cpu: f64,
    /// Bytes written to the device at prefill (all rows, text included).
    pub prefill_device_bytes: u64,
    /// Bytes written to the host at prefill (recallable copies).
    pub prefill_host_bytes: u64,
    /// Decode steps recorded.
    pub steps: u64,
    /// Total recall bytes.
    pub bytes_h2d: u64,
    /// Total recalls.
    pub recalls: u64,
    /// Total releases.
    pub releases: u64,
    /// Total failed recalls.
    pub failed_recalls: u64,
    /// Sum of per-step r_GPU (see [`RunMetrics::mean_r_gpu`]).
    pub r_gpu_sum: f64,
    /// Largest per-step r_GPU.
    pub r_gpu_max: f64,
    /// Sum of per-step r_GPU+CPU.
    pub r_gpu_cpu_sum: f64,
    /// Total policy time.
    pub policy_time: Duration,
    /// Largest per-step policy time.
    pub policy_time_max: Duration,
}

impl RunMetrics {
    /// Adds one step.
    pub fn record(&mut self, s: &StepMetrics) {
        self.steps += 1;
        self.bytes_h2d += s.bytes_h2d;
        self.recalls += u64::from(s.recalls);
        self.releases += u64::from(s.releases);
        self.failed_recalls += u64::from(s.failed_recalls);
        self.r_gpu_sum += s.r_gpu;
        self.r_gpu_max = self.r_gpu_max.max(s.r_gpu);
        self.r_gpu_cpu_sum += s.r_gpu_cpu;
        self.policy_time += s.policy_time;
        self.policy_time_max = self.policy_time_max.max(s.policy_time);
    }
    /// Mean per-step r_GPU (prefill value if no steps).
    pub fn mean_r_gpu(&self) -> f64 {
        if self.steps == 0 { self.prefill_r_gpu } else { self.r_gpu_sum / self.steps as f64 }
    }
    /// Mean per-step r_GPU+CPU (prefill value if no steps).
    pub fn mean_r_gpu_cpu(&self) -> f64 {
        if self.steps == 0 {
            self.prefill_r_gpu_cpu
        } else {
            self.r_gpu_cpu_sum / self.steps as f64
        }
    }
    /// Mean recall bytes per step.
    pub fn mean_bytes_per_step(&self) -> f64 {
        if self.steps == 0 { 0.0 } else { self.bytes_h2d as f64 / self.steps as f64 }
    }
    /// Mean policy time per step.
    pub fn mean_policy_time(&self) -> Duration {
        if self.steps == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(self.policy_time.as_secs_f64() / self.steps as f64)
        }
    }
}
