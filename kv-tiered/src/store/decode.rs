//! Decode steps (WnW §2.3 "Decode-Step Score Aggregation", "Dynamic Chunk Selection"): new
//! tokens are appended as always-resident rows; the runtime reports the step signal; at the
//! end of the step the policy decides, releases execute at once, recalls go to the worker.

use std::time::Instant;

use super::TieredStore;
use super::prefill::reserve_slot;
use super::shared::Job;
use crate::error::{Error, Result, check_finite, check_len, param};
use crate::metrics::StepMetrics;
use crate::policy::StepObservation;
use crate::tier::Tier;

impl<T: Tier> TieredStore<T> {
    /// Appends one generated token's K/V rows for every kv-head of `layer`
    /// (`kv_heads × head_dim` each). Generated tokens are text: always resident, dense.
    ///
    /// # Errors
    /// [`Error::Shape`]/[`Error::NonFinite`] for bad rows; [`Error::Capacity`] past
    /// `max_new_tokens`; [`Error::Tier`] if the device is full.
    pub fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) -> Result<()> {
        const OP: &str = "TieredStore::append";
        let (h, d) = (self.config.attn.kv_heads(), self.config.rows.head_dim);
        self.check_head(OP, layer, 0)?;
        check_len(OP, "keys", keys, h * d)?;
        check_len(OP, "values", values, h * d)?;
        check_finite(OP, "keys", keys)?;
        check_finite(OP, "values", values)?;
        if self.appended[layer] >= self.config.max_new_tokens {
            return Err(Error::Capacity { op: OP, capacity: self.config.max_new_tokens });
        }
        let pos = (self.config.layout.seq_len() + self.appended[layer]) as u32;
        let codec = self.config.rows.dense_codec();
        let (kr, vr) = (codec.row_bytes(d), codec.row_bytes(d));
        let super::AppendBufs { keys: mut kb, values: mut vb, topk: mut scratch, mut slots } =
            std::mem::take(&mut self.enc);
        kb.clear();
        vb.clear();
        let encoded = keys.chunks_exact(d).zip(values.chunks_exact(d)).try_for_each(|(k, v)| {
            codec
                .encode(k, &mut kb, &mut scratch)
                .and_then(|()| codec.encode(v, &mut vb, &mut scratch))
        });
        let tier = self.shared.tier.as_ref();
        let mut tables = self.shared.layers[layer].write();
        // All or nothing: reserve a slot in every head, write every row, then publish.
        let result = encoded.and_then(|()| {
            slots.clear();
            for t in tables.iter_mut() {
                slots.push(reserve_slot(tier, t, 0, layer)?);
            }
            for (k, (t, &(pi, fill))) in tables.iter().zip(slots.iter()).enumerate() {
                tier.write_device(
                    &t.permanent[pi],
                    fill,
                    &kb[k * kr..(k + 1) * kr],
                    &vb[k * vr..(k + 1) * vr],
                )?;
            }
            let page_rows = tier.pools()[0].page_rows as u32;
            for (t, &(pi, fill)) in tables.iter_mut().zip(slots.iter()) {
                t.lists[0].push(pos, t.permanent[pi].index() * page_rows + fill as u32);
                t.tails[0] = Some((pi, fill + 1));
            }
            Ok(())
        });
        drop(tables);
        self.enc = super::AppendBufs { keys: kb, values: vb, topk: scratch, slots };
        if result.is_ok() {
            self.appended[layer] += 1;
        }
        result
    }

    /// Adds an anchor head's softmax weights (already summed over its q-heads) at the given
    /// positions to this step's accumulator `A^{(s)}` (Eq. 2). Non-audio positions are ignored,
    /// so `positions`/`weights` can be the whole gathered list the kernel returns.
    ///
    /// # Errors
    /// [`Error::HeadOutOfRange`]; [`Error::Param`] if the head is not an anchor of the
    /// policy; [`Error::Shape`] for different lengths; [`Error::NonFinite`] for NaN weights.
    pub fn add_anchor_weights(
        &mut self,
        layer: usize,
        kv_head: usize,
        positions: &[u32],
        weights: &[f32],
    ) -> Result<()> {
        const OP: &str = "TieredStore::add_anchor_weights";
        let h = self.check_head(OP, layer, kv_head)?;
        if !self.policy.is_anchor(h) {
            return Err(param(OP, "head", h, "an anchor head of the policy"));
        }
        check_len(OP, "weights", weights, positions.len())?;
        check_finite(OP, "weights", weights)?;
        let a = self.config.layout.audio_span();
        for (&p, &w) in positions.iter().zip(weights) {
            if let Some(i) = (p as usize).checked_sub(a.start).filter(|&i| i < a.len()) {
                self.anchor_acc[i] += w;
            }
        }
        self.anchor_seen = true;
        Ok(())
    }

    /// Adds the anchor signal straight from a gathered kernel's `weights` output for `layer`
    /// (`DecodeAttention::gathered` over [`crate::LayerView::gathered_into`], or
    /// `GatheredSparseAttention::gathered_sparse` over
    /// [`crate::LayerView::gathered_parts_into`]): one weight per resident row, kv-head after
    /// kv-head — its dense rows in list order, then its SWAN sparse rows (none without
    /// sparse rows). Only anchor heads' audio rows count. Call after dropping the view and before the layer's next `append` or
    /// `end_step` (the lists must be the ones the kernel saw).
    ///
    /// # Errors
    /// [`Error::HeadOutOfRange`]; [`Error::Shape`] if `weights` does not match the layer's
    /// resident rows; [`Error::NonFinite`].
    pub fn add_gathered_weights(&mut self, layer: usize, weights: &[f32]) -> Result<()> {
        const OP: &str = "TieredStore::add_gathered_weights";
        self.check_head(OP, layer, 0)?;
        check_finite(OP, "weights", weights)?;
        let a = self.config.layout.audio_span();
        let tables = self.shared.layers[layer].read();
        let total: usize = tables.iter().flat_map(|t| &t.lists).map(|l| l.len()).sum();
        check_len(OP, "weights", weights, total)?;
        let mut off = 0;
        for (k, t) in tables.iter().enumerate() {
            let anchor = self.policy.is_anchor(layer * self.config.attn.kv_heads() + k);
            for list in &t.lists {
                if anchor {
                    let lo = list.positions().partition_point(|&p| (p as usize) < a.start);
                    for (i, &p) in list
                        .positions()
                        .iter()
                        .enumerate()
                        .skip(lo)
                        .take_while(|(_, p)| (**p as usize) < a.end)
                    {
                        self.anchor_acc[p as usize - a.start] += weights[off + i];
                    }
                    self.anchor_seen = true;
                }
                off += list.len();
            }
        }
        Ok(())
    }

    /// Adds a pre-aggregated audio score vector (`T_a` entries) to this step's accumulator,
    /// for runtimes that sum anchor weights themselves.
    ///
    /// # Errors
    /// [`Error::Shape`] for a wrong length; [`Error::NonFinite`] for NaN/∞.
    pub fn add_audio_weights(&mut self, weights: &[f32]) -> Result<()> {
        const OP: &str = "TieredStore::add_audio_weights";
        check_len(OP, "weights", weights, self.anchor_acc.len())?;
        check_finite(OP, "weights", weights)?;
        self.anchor_acc.iter_mut().zip(weights).for_each(|(a, &w)| *a += w);
        self.anchor_seen = true;
        Ok(())
    }

    /// Records `layer`'s queries (`q_heads × head_dim`) for policies that read them
    /// ([`crate::policy::StepSignal::Queries`]); a no-op for other policies.
    ///
    /// # Errors
    /// [`Error::HeadOutOfRange`]; [`Error::Shape`]; [`Error::NonFinite`].
    pub fn observe_queries(&mut self, layer: usize, q: &[f32]) -> Result<()> {
        const OP: &str = "TieredStore::observe_queries";
        self.check_head(OP, layer, 0)?;
        let n = self.config.attn.q_heads() * self.config.rows.head_dim;
        check_len(OP, "q", q, n)?;
        check_finite(OP, "q", q)?;
        if !self.queries.is_empty() {
            self.queries[layer * n..(layer + 1) * n].copy_from_slice(q);
            self.queries_seen += 1;
        }
        Ok(())
    }

    /// Waits until every issued recall landed or failed; applies failures. Returns the
    /// number of failures applied.
    ///
    /// # Errors
    /// [`Error::WorkerStopped`] if the worker died with recalls outstanding.
    pub fn sync(&mut self) -> Result<u32> {
        self.shared
            .wait_until(|p| p.per_layer.iter().all(|&n| n == 0), || self.worker_alive())
            .map_err(|pending| Error::WorkerStopped { pending })?;
        let mut p = self.shared.pending.lock();
        let n = p.failures.len() as u32;
        for f in p.failures.drain(..) {
            let (h, u) = (f.head as usize, f.unit as usize);
            self.residency.set_resident(h, u, false);
            let rows = self.shared.host.positions(h, u).len() as u64;
            self.counts.device_audio -= rows;
            self.counts.host_only_audio += rows;
        }
        Ok(n)
    }

    /// Ends the decode step: lets the policy decide from this step's signal, releases
    /// units at once, issues recalls to the worker, resets the anchor accumulator.
    ///
    /// # Errors
    /// [`Error::WorkerStopped`]; [`Error::Param`] if the policy planned an invalid move.
    pub fn end_step(&mut self) -> Result<&StepMetrics> {
        let failed = self.sync()?;
        let start = Instant::now();
        self.plan.clear();
        let anchor_weights: &[f32] = if self.anchor_seen { &self.anchor_acc } else { &[] };
        let queries: &[f32] =
            if self.queries_seen == self.config.layers { &self.queries } else { &[] };
        let obs = StepObservation {
            step: self.step,
            anchor_weights,
            queries,
            q_heads: self.config.attn.q_heads(),
        };
        self.policy.plan_step(&obs, &self.residency, &mut self.plan);
        self.check_plan()?;
        let releases = self.release_planned();
        let (recalls, alloc_failed, bytes) = self.issue_recalls()?;
        if self.anchor_seen {
            self.anchor_acc.fill(0.0);
            self.anchor_seen = false;
        }
        self.queries_seen = 0;
        self.last = StepMetrics {
            step: self.step,
            r_gpu: self.r_gpu(),
            r_gpu_cpu: self.r_gpu_cpu(),
            bytes_h2d: bytes,
            recalls,
            releases,
            failed_recalls: failed + alloc_failed,
            policy_time: start.elapsed(),
        };
        self.run.record(&self.last);
        self.step += 1;
        Ok(&self.last)
    }

    fn check_plan(&self) -> Result<()> {
        const OP: &str = "Policy::plan_step";
        let (heads, units) = (self.config.total_kv_heads(), self.residency.units());
        for &(h, u) in &self.plan.recalls {
            let (h, u) = (h as usize, u as usize);
            if h >= heads
                || u >= units
                || !self.residency.recallable(h, u)
                || self.residency.resident(h, u)
            {
                return Err(param(
                    OP,
                    "recall",
                    format!("(head {h}, unit {u})"),
                    "a recallable, non-resident unit",
                ));
            }
        }
        for &(h, u) in &self.plan.releases {
            let (h, u) = (h as usize, u as usize);
            if h >= heads || u >= units || !self.residency.resident(h, u) {
                return Err(param(
                    OP,
                    "release",
                    format!("(head {h}, unit {u})"),
                    "a resident unit",
                ));
            }
        }
        Ok(())
    }

    /// Executes the planned releases (no recall is in flight: `sync` ran).
    fn release_planned(&mut self) -> u32 {
        let (kv, a0, unit) =
            (self.config.attn.kv_heads(), self.config.layout.audio_start() as u32, self.unit_len());
        let page_rows = self.shared.page_rows as u32;
        for i in 0..self.plan.releases.len() {
            let (h, u) = (self.plan.releases[i].0 as usize, self.plan.releases[i].1 as usize);
            let mut tables = self.shared.layers[h / kv].write();
            let t = &mut tables[h % kv];
            if let Some(page) = t.recalled[u].take() {
                let first = page.index() * page_rows;
                let (lo, hi) = (a0 + (u * unit) as u32, a0 + ((u + 1) * unit) as u32);
                t.lists[page.pool()].remove_rows(lo, hi, first..first + page_rows);
                self.shared.tier.free_device(page);
            }
            drop(tables);
            self.residency.set_resident(h, u, false);
            let rows = self.shared.host.positions(h, u).len() as u64;
            self.counts.device_audio -= rows;
            self.counts.host_only_audio += rows;
        }
        self.plan.releases.len() as u32
    }

    /// Allocates device pages and sends recall jobs, layer by layer.
    fn issue_recalls(&mut self) -> Result<(u32, u32, u64)> {
        self.plan.recalls.sort_unstable();
        let kv = self.config.attn.kv_heads();
        let (mut failed, mut bytes) = (0u32, 0u64);
        for &(h, u) in &self.plan.recalls {
            let (hu, uu) = (h as usize, u as usize);
            let Some(src) = self.shared.host.page(hu, uu) else { continue };
            let pool = usize::from(self.heads[hu].audio_pool);
            match self.shared.tier.alloc_device(pool, hu / kv) {
                Ok(dst) => self.jobs_buf.push(Job { head: h, unit: u, src, dst }),
                Err(_) => failed += 1,
            }
        }
        {
            let mut p = self.shared.pending.lock();
            for j in &self.jobs_buf {
                p.per_layer[j.head as usize / kv] += 1;
            }
        }
        let issued = self.jobs_buf.len() as u32;
        let mut jobs = std::mem::take(&mut self.jobs_buf);
        let mut drain = jobs.drain(..);
        let mut outcome = Ok(());
        while let Some(job) = drain.next() {
            let (h, u) = (job.head as usize, job.unit as usize);
            let rows = self.shared.host.positions(h, u).len();
            bytes += self.shared.tier.pools()[job.dst.pool()].rows_bytes(rows) as u64;
            self.residency.set_resident(h, u, true);
            self.counts.device_audio += rows as u64;
            self.counts.host_only_audio -= rows as u64;
            let sent = self.jobs.as_ref().map(|tx| tx.send(job));
            if let Some(Err(e)) = sent {
                self.shared.tier.free_device(e.into_inner().dst);
                outcome = Err(Error::WorkerStopped { pending: drain.len() + 1 });
                drain.by_ref().for_each(|j| self.shared.tier.free_device(j.dst));
            }
        }
        drop(drain);
        self.jobs_buf = jobs;
        outcome.map(|()| (issued, failed, bytes))
    }

    fn unit_len(&self) -> usize {
        self.policy.unit_len(&self.config.layout)
    }
}
