//! The driver shared by every optimized CPU kernel: split a layer's decode step into work
//! items, run them on the thread pool, merge the partial softmax states, write outputs.
//!
//! A work item is `(kv-head, lane block, row range)`: a lane block is up to [`MAX_LANES`]
//! q-heads of one GQA group (one pass over the rows serves them all), a row range is at
//! most `split_rows` consecutive rows in token order. Items are fixed by the input's shape
//! only — never by the thread count — and their partial states `(m, l, acc)` are merged in
//! row order, so the output is bit-for-bit the same on 1 or N threads. This is the
//! split-K ("flash-decoding") form of the online softmax the hybrid cache needs (SWAN
//! method section: one softmax over sparse history and dense buffer).
//!
//! After the first call with a given shape, a call allocates nothing: items, per-item
//! states and per-thread scratch live in [`Workspace`] and are reused; [`Engine::reserve`]
//! sizes them up front for a cache that grows (one row per decode step).

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::config::AttnConfig;
use crate::pool::ThreadPool;

use super::segment::{LOG2_E, Scratch, Slot};
use super::tile::{Kernels, MAX_LANES};

/// One unit of parallel work.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    pub kv: usize,
    pub block: usize,
    pub rows: Range<usize>,
}

/// Everything one decode call shares with its work items.
pub(crate) struct Job<'a> {
    pub cfg: &'a AttnConfig,
    pub q: &'a [f32],
    /// Keep log2-domain scores per row (for softmax weights).
    pub capture: bool,
}

impl Job<'_> {
    /// Lanes per block for this layout: 4 for groups of ≤ 4 q-heads, else 8.
    pub fn lanes(&self) -> usize {
        if self.cfg.group_size() <= 4 { 4 } else { 8 }
    }

    /// Lane blocks per kv-head.
    pub fn blocks(&self) -> usize {
        self.cfg.group_size().div_ceil(self.lanes())
    }

    /// q-heads `first..first + active` served by `block` of kv-head `kv`.
    pub fn heads(&self, kv: usize, block: usize) -> Range<usize> {
        let g = self.cfg.group_size();
        let first = kv * g + block * self.lanes();
        first..first + self.lanes().min(g - block * self.lanes())
    }

    /// The queries of the heads of `block` of kv-head `kv` (`active × d`).
    pub fn queries(&self, kv: usize, block: usize) -> &[f32] {
        let h = self.heads(kv, block);
        let d = self.cfg.head_dim();
        &self.q[h.start * d..h.end * d]
    }

    /// The factor every logit carries: softmax scale and `log2 e`.
    pub fn logit_scale(&self) -> f32 {
        self.cfg.scale() * LOG2_E
    }
}

/// A kernel's input as the driver sees it: rows per kv-head, and how to stream a range.
pub(crate) trait ItemSource: Sync {
    /// Rows (tokens) of kv-head `kv`.
    fn rows(&self, kv: usize) -> usize;
    /// Streams `item.rows` of `item.kv` through `slot` (already reset), `W` lanes.
    fn run<const W: usize>(
        &self,
        k: Kernels,
        job: &Job<'_>,
        item: &Item,
        sc: &mut Scratch,
        slot: &mut Slot,
    );
}

/// Final running maximum and sum of one (kv-head, lane block), for softmax weights.
#[derive(Clone, Copy, Debug, Default)]
struct Final {
    m: [f32; MAX_LANES],
    l: [f32; MAX_LANES],
}

/// Reusable buffers of the CPU kernels.
#[derive(Debug, Default)]
pub(crate) struct Workspace {
    items: Vec<Item>,
    slots: Vec<Mutex<Slot>>,
    scratch: Vec<Mutex<Scratch>>,
    finals: Vec<Final>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic inside a kernel propagates out of the call; the buffers it leaves behind are
    // reset before every use, so a poisoned lock carries no broken invariant.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Workspace {
    fn plan<S: ItemSource>(&mut self, job: &Job<'_>, src: &S, split_rows: usize) {
        self.items.clear();
        for kv in 0..job.cfg.kv_heads() {
            let rows = src.rows(kv);
            for block in 0..job.blocks() {
                let mut start = 0;
                while start < rows {
                    let end = rows.min(start + split_rows);
                    self.items.push(Item { kv, block, rows: start..end });
                    start = end;
                }
            }
        }
        while self.slots.len() < self.items.len() {
            self.slots.push(Mutex::default());
        }
    }
}

/// The CPU kernels' machinery: thread pool, buffers, instruction set, item size.
#[derive(Debug)]
pub(crate) struct Engine {
    pub pool: ThreadPool,
    pub ws: Workspace,
    pub kernels: Kernels,
    pub split_rows: usize,
    /// Round the queries to `q8_0` blocks before scoring ([`crate::QueryPrecision::Q8Blocks`]).
    pub round_queries: bool,
    /// The rounded queries of the current call (reused).
    pub rounded: Vec<f32>,
}

/// `q` (rows of `head_dim`) rounded into `out` as ggml's `q8_0` blocks round it: every run
/// of [`kv_sparse::quant::BLOCK`] elements of a row (a short last run as if zero-padded)
/// encoded by [`kv_sparse::quant::Int8Blocks`] and decoded back. A run with a non-finite
/// element or one too large for an f16 scale is copied unrounded.
pub(crate) fn round_q8_blocks(q: &[f32], head_dim: usize, out: &mut Vec<f32>) {
    use kv_sparse::quant::{BLOCK, DenseCodec, Int8Blocks};
    out.clear();
    out.extend_from_slice(q);
    let mut block = [0.0f32; BLOCK];
    let mut buf = [0u8; 2 * BLOCK];
    let bytes = &mut buf[..Int8Blocks::row_bytes(BLOCK)];
    for row in out.chunks_mut(head_dim.max(1)) {
        for run in row.chunks_mut(BLOCK) {
            if !run.iter().all(|x| x.is_finite() && x.abs() < Int8Blocks::OVERFLOW_AT) {
                continue;
            }
            block.fill(0.0);
            block[..run.len()].copy_from_slice(run);
            Int8Blocks::encode(&block, bytes);
            Int8Blocks::decode(bytes, &mut block);
            run.copy_from_slice(&block[..run.len()]);
        }
    }
}

impl Engine {
    /// Grows the workspace to what calls with layout `cfg` over up to `rows` rows per
    /// kv-head need (with captured scores), on every thread.
    pub fn reserve(&mut self, cfg: &AttnConfig, rows: usize) {
        let job = Job { cfg, q: &[], capture: true };
        let (lanes, d) = (job.lanes(), cfg.head_dim());
        let per_item = rows.min(self.split_rows);
        let items = cfg.kv_heads() * job.blocks() * rows.div_ceil(self.split_rows);
        let ws = &mut self.ws;
        ws.items.reserve(items.saturating_sub(ws.items.len()));
        ws.finals.reserve((cfg.kv_heads() * job.blocks()).saturating_sub(ws.finals.len()));
        while ws.slots.len() < items {
            ws.slots.push(Mutex::default());
        }
        for slot in &ws.slots {
            let slot = &mut *lock(slot);
            let (acc, capture) = (lanes * d, per_item * lanes);
            slot.acc.reserve(acc.saturating_sub(slot.acc.len()));
            slot.capture.reserve(capture.saturating_sub(slot.capture.len()));
        }
        while ws.scratch.len() < self.pool.threads() {
            ws.scratch.push(Mutex::default());
        }
        for sc in &ws.scratch {
            lock(sc).prepare(lanes, d);
        }
    }

    /// Runs one decode call: plan, parallel items, merge into `out`, optional weights.
    pub fn execute<S: ItemSource>(
        &mut self,
        job: &Job<'_>,
        src: &S,
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) {
        let mut rounded = std::mem::take(&mut self.rounded);
        let q = if self.round_queries {
            round_q8_blocks(job.q, job.cfg.head_dim(), &mut rounded);
            &rounded[..]
        } else {
            job.q
        };
        let job = Job { q, ..*job };
        match job.lanes() {
            4 => self.execute_w::<S, 4>(&job, src, out, weights),
            _ => self.execute_w::<S, 8>(&job, src, out, weights),
        }
        self.rounded = rounded;
    }

    fn execute_w<S: ItemSource, const W: usize>(
        &mut self,
        job: &Job<'_>,
        src: &S,
        out: &mut [f32],
        weights: Option<&mut [f32]>,
    ) {
        let ws = &mut self.ws;
        ws.plan(job, src, self.split_rows);
        while ws.scratch.len() < self.pool.threads() {
            ws.scratch.push(Mutex::default());
        }
        let (d, k) = (job.cfg.head_dim(), self.kernels);
        let next = AtomicUsize::new(0);
        let (items, slots, scratch) = (&ws.items, &ws.slots, &ws.scratch);
        self.pool.broadcast(&|thread| {
            let mut sc = lock(&scratch[thread]);
            sc.prepare(W, d);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let mut slot = lock(&slots[i]);
                slot.reset(W, d);
                if job.capture {
                    slot.capture.clear();
                    slot.capture.resize(item.rows.len() * W, 0.0);
                }
                src.run::<W>(k, job, item, &mut sc, &mut slot);
            }
        });
        merge::<W>(ws, job, out);
        if let Some(w) = weights {
            softmax_weights::<S, W>(ws, job, src, w);
        }
    }
}

/// Merges the items of each (kv-head, lane block) in row order and writes the outputs.
fn merge<const W: usize>(ws: &mut Workspace, job: &Job<'_>, out: &mut [f32]) {
    let d = job.cfg.head_dim();
    ws.finals.clear();
    let mut i = 0;
    while i < ws.items.len() {
        let (kv, block) = (ws.items[i].kv, ws.items[i].block);
        let mut first = lock(&ws.slots[i]);
        i += 1;
        while i < ws.items.len() && ws.items[i].kv == kv && ws.items[i].block == block {
            combine::<W>(&mut first, &lock(&ws.slots[i]));
            i += 1;
        }
        for (lane, h) in job.heads(kv, block).enumerate() {
            let inv = 1.0 / first.l[lane];
            let acc = &first.acc[lane * d..(lane + 1) * d];
            out[h * d..(h + 1) * d].iter_mut().zip(acc).for_each(|(o, a)| *o = a * inv);
        }
        ws.finals.push(Final { m: first.m, l: first.l });
    }
}

/// `a ← a ⊕ b`: the online-softmax merge of two partial states over disjoint rows.
fn combine<const W: usize>(a: &mut Slot, b: &Slot) {
    let d = a.acc.len() / W;
    for h in 0..W {
        let m = a.m[h].max(b.m[h]);
        let (fa, fb) = ((a.m[h] - m).exp2(), (b.m[h] - m).exp2());
        a.l[h] = a.l[h] * fa + b.l[h] * fb;
        a.m[h] = m;
        let (xa, xb) = (&mut a.acc[h * d..(h + 1) * d], &b.acc[h * d..(h + 1) * d]);
        xa.iter_mut().zip(xb).for_each(|(x, y)| *x = *x * fa + y * fb);
    }
}

/// `w[off(kv) + r] = Σ_{q-heads h of kv} softmax_h(row r)` from the captured scores.
fn softmax_weights<S: ItemSource, const W: usize>(
    ws: &Workspace,
    job: &Job<'_>,
    src: &S,
    w: &mut [f32],
) {
    let mut offsets = 0;
    let mut final_index = 0;
    let mut i = 0;
    for kv in 0..job.cfg.kv_heads() {
        let rows = src.rows(kv);
        let out = &mut w[offsets..offsets + rows];
        out.fill(0.0);
        for block in 0..job.blocks() {
            let fin = ws.finals[final_index];
            final_index += 1;
            let active = job.heads(kv, block).len();
            while i < ws.items.len() && ws.items[i].kv == kv && ws.items[i].block == block {
                let slot = lock(&ws.slots[i]);
                let range = ws.items[i].rows.clone();
                for (o, s) in out[range].iter_mut().zip(slot.capture.chunks_exact(W)) {
                    *o += (0..active).map(|h| (s[h] - fin.m[h]).exp2() / fin.l[h]).sum::<f32>();
                }
                i += 1;
            }
        }
        offsets += rows;
    }
}
