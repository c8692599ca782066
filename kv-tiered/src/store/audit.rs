//! Audit: recounts residency from the tables and checks the store's invariants (WnW §3.4
//! metrics; the tier contract's "never lose a CPU copy, never corrupt residency"). Tests and
//! users' property tests call [`TieredStore::audit`] after any sequence of steps.

use std::collections::HashSet;

use super::TieredStore;
use crate::error::Result;
use crate::tier::Tier;

/// What one head holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadAudit {
    /// Audio positions resident on the device.
    pub device_audio: usize,
    /// Audio positions with a host copy.
    pub host_audio: usize,
    /// Audio positions resident or recallable (`|device ∪ host|`).
    pub covered: usize,
    /// Units currently recalled.
    pub recalled_units: usize,
}

/// Result of [`TieredStore::audit`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Audit {
    /// Per head (index `layer · kv_heads + kv_head`).
    pub heads: Vec<HeadAudit>,
    /// Recounted r_GPU.
    pub r_gpu: f64,
    /// Recounted r_GPU+CPU.
    pub r_gpu_cpu: f64,
    /// Broken invariants, human-readable; empty when all hold.
    pub violations: Vec<String>,
}

impl<T: Tier> TieredStore<T> {
    /// Waits for outstanding recalls, then recounts and checks: sorted unique lists, text and
    /// generated tokens resident in the dense pool, recalled units fully resident,
    /// non-recalled host rows absent from the device, residency flags matching the tables,
    /// running counters matching the recount.
    ///
    /// # Errors
    /// [`crate::Error::WorkerStopped`] if the recall worker died.
    pub fn audit(&mut self) -> Result<Audit> {
        self.sync()?;
        let mut audit = Audit::default();
        for h in 0..self.config.total_kv_heads() {
            let head = self.audit_head(h, &mut audit.violations);
            audit.heads.push(head);
        }
        let full = (self.config.total_kv_heads() * self.config.layout.audio_len()) as f64;
        let dev: usize = audit.heads.iter().map(|a| a.device_audio).sum();
        let cov: usize = audit.heads.iter().map(|a| a.covered).sum();
        (audit.r_gpu, audit.r_gpu_cpu) = (dev as f64 / full, cov as f64 / full);
        if dev as u64 != self.counts.device_audio
            || (cov - dev) as u64 != self.counts.host_only_audio
        {
            audit.violations.push(format!(
                "counters {:?} vs recount device {dev}, host-only {}",
                self.counts,
                cov - dev
            ));
        }
        Ok(audit)
    }

    fn audit_head(&self, h: usize, v: &mut Vec<String>) -> HeadAudit {
        let (kv, layout) = (self.config.attn.kv_heads(), self.config.layout);
        let (l, k) = (h / kv, h % kv);
        let tables = self.shared.layers[l].read();
        let t = &tables[k];
        let mut resident = HashSet::new();
        for (pool, list) in t.lists.iter().enumerate() {
            if !list.positions().windows(2).all(|w| w[0] < w[1]) {
                v.push(format!("head {h} pool {pool}: positions not strictly ascending"));
            }
            for &p in list.positions() {
                if !resident.insert(p) {
                    v.push(format!("head {h}: position {p} resident twice"));
                }
            }
        }
        let text_end = layout.seq_len() + self.appended[l];
        let dense: HashSet<u32> = t.lists[0].positions().iter().copied().collect();
        if let Some(p) =
            (0..text_end).find(|&p| !layout.is_audio(p) && !dense.contains(&(p as u32)))
        {
            v.push(format!("head {h}: text position {p} not resident"));
        }
        let mut host = HashSet::new();
        let mut recalled = 0;
        for u in 0..self.residency.units() {
            let pos = self.shared.host.positions(h, u);
            host.extend(pos.iter().copied());
            let on = t.recalled[u].is_some();
            recalled += usize::from(on);
            if on != self.residency.resident(h, u) {
                v.push(format!(
                    "head {h} unit {u}: table recalled={on}, residency flag={}",
                    self.residency.resident(h, u)
                ));
            }
            if pos.iter().any(|p| resident.contains(p) != on) {
                v.push(format!(
                    "head {h} unit {u}: host rows {} on the device",
                    if on { "not all" } else { "partly" }
                ));
            }
        }
        let device_audio = resident.iter().filter(|&&p| layout.is_audio(p as usize)).count();
        let covered = resident
            .iter()
            .filter(|&&p| layout.is_audio(p as usize))
            .chain(host.iter())
            .collect::<HashSet<_>>()
            .len();
        HeadAudit { device_audio, host_audio: host.len(), covered, recalled_units: recalled }
    }
}
