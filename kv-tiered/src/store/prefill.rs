//! Prefill (WnW §2.3 "Prefill Compression"): validate the prompt K/V and scores, ask the
//! policy for per-head plans, write text and retained audio rows to the device, recallable
//! complements to the host (one page per unit), build residency tables and start the recall
//! worker. On any error every page allocated so far is returned to the tier.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use super::shared::{HeadTables, HostIndex, Pending, Shared, worker_loop};
use super::{AppendBufs, Counts, HeadMeta, PromptKv, StoreConfig, TieredStore};
use crate::error::{Result, check_finite, check_len, check_scores, param};
use crate::metrics::{RunMetrics, StepMetrics};
use crate::policy::{
    HeadPlan, Policy, PrefillContext, PrefillSignal, Residency, StepPlan, StepSignal,
};
use crate::residency::PosRows;
use crate::rows::RowCodec;
use crate::tier::{PoolSpec, Tier};

/// Reusable encode buffers.
#[derive(Default)]
struct Bufs {
    keys: Vec<u8>,
    values: Vec<u8>,
    topk: Vec<usize>,
    positions: Vec<u32>,
    /// Run length of each position (empty: every row is its own position).
    runs: Vec<u32>,
    mean: Vec<f32>,
}

impl Bufs {
    /// Encodes the rows of `positions` (absolute) from `keys`/`values` (`seq_len × head_dim`).
    fn encode(
        &mut self,
        codecs: (RowCodec, RowCodec),
        keys: &[f32],
        values: &[f32],
        head_dim: usize,
    ) -> Result<()> {
        self.keys.clear();
        self.values.clear();
        for (i, &p) in self.positions.iter().enumerate() {
            let run = self.runs.get(i).map_or(1, |&n| n as usize);
            let r = p as usize * head_dim..(p as usize + run) * head_dim;
            if run == 1 {
                codecs.0.encode(&keys[r.clone()], &mut self.keys, &mut self.topk)?;
                codecs.1.encode(&values[r], &mut self.values, &mut self.topk)?;
            } else {
                for (src, codec, out) in
                    [(keys, codecs.0, &mut self.keys), (values, codecs.1, &mut self.values)]
                {
                    mean_rows(&src[r.clone()], head_dim, &mut self.mean);
                    codec.encode(&self.mean, out, &mut self.topk)?;
                }
            }
        }
        Ok(())
    }
}

/// The mean of the `head_dim`-wide rows of `rows`, into `out`.
fn mean_rows(rows: &[f32], head_dim: usize, out: &mut Vec<f32>) {
    out.clear();
    out.resize(head_dim, 0.0);
    let n = rows.len() / head_dim;
    for row in rows.chunks_exact(head_dim) {
        for (o, &x) in out.iter_mut().zip(row) {
            *o += x;
        }
    }
    for o in out.iter_mut() {
        *o /= n as f32;
    }
}

/// The `(index into permanent, first free row)` of `pool`'s tail page, allocating a fresh
/// page when the tail is full. On allocation failure nothing changes.
pub(super) fn reserve_slot<T: Tier>(
    tier: &T,
    t: &mut HeadTables,
    pool: usize,
    layer: usize,
) -> Result<(usize, usize)> {
    match t.tails[pool] {
        Some((pi, fill)) if fill < tier.pools()[pool].page_rows => Ok((pi, fill)),
        _ => {
            t.permanent.push(tier.alloc_device(pool, layer)?);
            t.tails[pool] = Some((t.permanent.len() - 1, 0));
            Ok((t.permanent.len() - 1, 0))
        }
    }
}

/// Appends already encoded rows as permanent rows of `(pool, layer)`, filling the tail page.
fn write_permanent<T: Tier>(
    tier: &T,
    t: &mut HeadTables,
    pool: usize,
    layer: usize,
    positions: &[u32],
    keys: &[u8],
    values: &[u8],
) -> Result<()> {
    let spec: PoolSpec = tier.pools()[pool];
    let (kr, vr, p) = (spec.key_row_bytes, spec.value_row_bytes, spec.page_rows);
    let mut i = 0;
    while i < positions.len() {
        let (pi, fill) = reserve_slot(tier, t, pool, layer)?;
        let take = (p - fill).min(positions.len() - i);
        tier.write_device(
            &t.permanent[pi],
            fill,
            &keys[i * kr..(i + take) * kr],
            &values[i * vr..(i + take) * vr],
        )?;
        let base = t.permanent[pi].index() * p as u32 + fill as u32;
        for j in 0..take {
            t.lists[pool].push(positions[i + j], base + j as u32);
        }
        t.tails[pool] = Some((pi, fill + take));
        i += take;
    }
    Ok(())
}

/// What prefill built, handed to the running store.
struct Built {
    layers: Vec<Vec<HeadTables>>,
    host: HostIndex,
    residency: Residency,
    counts: Counts,
    run: RunMetrics,
}

/// Builds tables and host copies head by head; frees everything if dropped unfinished.
struct Builder<'a, T: Tier> {
    config: &'a StoreConfig,
    tier: &'a T,
    unit: usize,
    units: usize,
    layers: Vec<Vec<HeadTables>>,
    host: HostIndex,
    residency: Residency,
    counts: Counts,
    run: RunMetrics,
    bufs: Bufs,
    finished: bool,
}

impl<T: Tier> Drop for Builder<'_, T> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for t in self.layers.iter_mut().flatten() {
            for page in t.permanent.drain(..).chain(t.recalled.iter_mut().filter_map(Option::take))
            {
                self.tier.free_device(page);
            }
        }
        for page in self.host.pages.iter().flatten() {
            self.tier.free_host(*page);
        }
    }
}

impl<'a, T: Tier> Builder<'a, T> {
    /// Reserves decode capacity and hands the tables over (nothing is freed any more).
    fn finish(mut self) -> Built {
        self.reserve_decode_pages();
        self.finished = true;
        Built {
            layers: std::mem::take(&mut self.layers),
            host: std::mem::take(&mut self.host),
            residency: std::mem::replace(&mut self.residency, Residency::new(0, 0)),
            counts: self.counts,
            run: std::mem::take(&mut self.run),
        }
    }

    /// Capacity hints: generated-token pages of every head plus one page per recallable unit
    /// (the most recall can ever hold at once), so decode steps never grow an arena.
    fn reserve_decode_pages(&mut self) {
        let c = self.config;
        let page_rows = self.tier.pools()[0].page_rows;
        let per_head = c.max_new_tokens.div_ceil(page_rows) + 1;
        for (l, layer) in self.layers.iter_mut().enumerate() {
            let mut recall = [0usize; 2];
            for (k, t) in layer.iter_mut().enumerate() {
                t.permanent.reserve(per_head);
                for u in 0..self.units {
                    if let (Some(page), None) =
                        (self.host.page(l * c.attn.kv_heads() + k, u), &t.recalled[u])
                    {
                        recall[page.pool()] += 1;
                    }
                }
            }
            self.tier.reserve_device(0, l, c.attn.kv_heads() * per_head + recall[0]);
            if c.rows.sparse.is_some() {
                self.tier.reserve_device(1, l, recall[1]);
            }
        }
    }

    fn new(config: &'a StoreConfig, tier: &'a T, unit: usize) -> Self {
        let units = config.layout.audio_len().div_ceil(unit);
        let heads = config.total_kv_heads();
        let host = HostIndex {
            units,
            pages: Vec::with_capacity(heads * units),
            offsets: vec![0],
            positions: Vec::new(),
        };
        Self {
            config,
            tier,
            unit,
            units,
            layers: (0..config.layers)
                .map(|_| Vec::with_capacity(config.attn.kv_heads()))
                .collect(),
            host,
            residency: Residency::new(heads, units),
            counts: Counts::default(),
            run: RunMetrics::default(),
            bufs: Bufs::default(),
            finished: false,
        }
    }

    fn tables(&self) -> HeadTables {
        let c = self.config;
        let dense = c.layout.seq_len() + c.max_new_tokens;
        let sparse = if c.rows.sparse.is_some() { c.layout.audio_len() } else { 0 };
        HeadTables {
            lists: [PosRows::with_capacity(dense), PosRows::with_capacity(sparse)],
            recalled: (0..self.units).map(|_| None).collect(),
            permanent: Vec::new(),
            tails: [None, None],
        }
    }

    fn head(&mut self, h: usize, plan: &HeadPlan, kv: &dyn PromptKv) -> Result<HeadMeta> {
        let (c, d) = (self.config, self.config.rows.head_dim);
        let (l, k) = (h / c.attn.kv_heads(), h % c.attn.kv_heads());
        let (keys, values) = (kv.keys(l, k), kv.values(l, k));
        let audio_pool = usize::from(c.rows.sparse.is_some() && !plan.exact);
        // The tables join the builder before any page is allocated, so a failure below hands
        // every page already taken back to the tier (the builder's `Drop`).
        debug_assert_eq!(self.layers[l].len(), k);
        let tables = self.tables();
        self.layers[l].push(tables);
        let t = &mut self.layers[l][k];
        let a0 = c.layout.audio_start() as u32;
        // Permanent rows, pool by pool, positions ascending.
        for pool in 0..c.rows.num_pools() {
            self.bufs.positions.clear();
            self.bufs.runs.clear();
            if pool == 0 {
                self.bufs.positions.extend(0..a0);
            }
            if pool == audio_pool {
                if !plan.pooled.is_empty() {
                    self.bufs.runs.resize(self.bufs.positions.len(), 1);
                    self.bufs.runs.extend_from_slice(&plan.pooled);
                }
                self.bufs.positions.extend(plan.device.iter().map(|&i| a0 + i));
            }
            if pool == 0 {
                self.bufs
                    .positions
                    .extend(c.layout.audio_span().end as u32..c.layout.seq_len() as u32);
                if !self.bufs.runs.is_empty() {
                    self.bufs.runs.resize(self.bufs.positions.len(), 1);
                }
            }
            self.bufs.encode(c.rows.codecs(pool), keys, values, d)?;
            write_permanent(
                self.tier,
                t,
                pool,
                l,
                &self.bufs.positions,
                &self.bufs.keys,
                &self.bufs.values,
            )?;
            self.run.prefill_device_bytes += (self.bufs.keys.len() + self.bufs.values.len()) as u64;
        }
        self.counts.device_audio += plan.device.len() as u64;
        self.host_units(h, plan, audio_pool, keys, values)?;
        Ok(HeadMeta { audio_pool: audio_pool as u8 })
    }

    /// Host copies of the head's recallable positions, one page per unit; initial recalls.
    fn host_units(
        &mut self,
        h: usize,
        plan: &HeadPlan,
        pool: usize,
        keys: &[f32],
        values: &[f32],
    ) -> Result<()> {
        let (c, d) = (self.config, self.config.rows.head_dim);
        let a0 = c.layout.audio_start() as u32;
        let mut rest = plan.host.as_slice();
        for u in 0..self.units {
            let end = ((u + 1) * self.unit) as u32;
            let n = rest.partition_point(|&i| i < end);
            let (mine, tail) = rest.split_at(n);
            rest = tail;
            if mine.is_empty() {
                self.host.pages.push(None);
                self.host.offsets.push(self.host.positions.len() as u32);
                continue;
            }
            self.bufs.positions.clear();
            self.bufs.positions.extend(mine.iter().map(|&i| a0 + i));
            self.bufs.encode(c.rows.codecs(pool), keys, values, d)?;
            let page = self.tier.alloc_host(pool)?;
            self.host.pages.push(Some(page));
            self.host.offsets.push((self.host.positions.len() + n) as u32);
            self.host.positions.extend_from_slice(&self.bufs.positions);
            self.tier.write_host(page, 0, &self.bufs.keys, &self.bufs.values)?;
            self.run.prefill_host_bytes += (self.bufs.keys.len() + self.bufs.values.len()) as u64;
            self.residency.set_recallable(h, u);
            if plan.initially_resident.binary_search(&(u as u32)).is_ok() {
                self.initial_recall(h, u, pool)?;
            } else {
                self.counts.host_only_audio += n as u64;
            }
        }
        Ok(())
    }

    /// Places unit `u`'s host rows (still in `bufs`) on the device at prefill.
    fn initial_recall(&mut self, h: usize, u: usize, pool: usize) -> Result<()> {
        let (l, k) = (h / self.config.attn.kv_heads(), h % self.config.attn.kv_heads());
        let page = self.tier.alloc_device(pool, l)?;
        let t = &mut self.layers[l][k];
        let first = page.index() * self.tier.pools()[pool].page_rows as u32;
        let written = self.tier.write_device(&page, 0, &self.bufs.keys, &self.bufs.values);
        t.recalled[u] = Some(page);
        written?;
        t.lists[pool].merge_in(&self.bufs.positions, first);
        self.residency.set_resident(h, u, true);
        self.counts.device_audio += self.bufs.positions.len() as u64;
        Ok(())
    }
}

impl<T: Tier> TieredStore<T> {
    /// Builds the store from the prompt: validates inputs, plans with `policy`, writes every
    /// row to its tier and starts the recall worker.
    ///
    /// `scores` are the per-head audio scores `policy.prefill_signal()` asks for
    /// (`L·H_kv × T_a`, head-major, finite, non-negative; empty for `PrefillSignal::None`).
    ///
    /// # Errors
    /// [`crate::Error::Shape`] / [`crate::Error::NonFinite`] / [`crate::Error::Negative`] for
    /// bad K/V or scores; [`crate::Error::Param`] for a tier whose pools do not match the
    /// configuration or an invalid plan; [`crate::Error::Tier`] if the tier runs out of memory
    /// (all pages are returned).
    pub fn prefill(
        config: StoreConfig,
        tier: Arc<T>,
        mut policy: Box<dyn Policy>,
        kv: &dyn PromptKv,
        scores: &[f32],
    ) -> Result<Self> {
        config.validate()?;
        let unit = policy.unit_len(&config.layout);
        check_tier(&config, tier.as_ref(), unit)?;
        check_kv(&config, kv)?;
        check_prefill_scores(&config, policy.prefill_signal(), scores)?;
        let (d, a) = (config.rows.head_dim, config.layout.audio_span());
        let audio_keys = |h: usize| {
            &kv.keys(h / config.attn.kv_heads(), h % config.attn.kv_heads())[a.start * d..a.end * d]
        };
        let ctx = PrefillContext {
            layout: &config.layout,
            layers: config.layers,
            kv_heads: config.attn.kv_heads(),
            head_dim: d,
            scores,
            audio_keys: &audio_keys,
        };
        let plans = policy.plan_prefill(&ctx)?;
        check_plans(&plans, &config, unit)?;
        let mut b = Builder::new(&config, tier.as_ref(), unit);
        let heads =
            plans.iter().enumerate().map(|(h, p)| b.head(h, p, kv)).collect::<Result<Vec<_>>>()?;
        let built = b.finish();
        Self::start(config, tier, policy, heads, built)
    }

    /// Shares the built tables with a new recall worker and assembles the store.
    fn start(
        config: StoreConfig,
        tier: Arc<T>,
        policy: Box<dyn Policy>,
        heads: Vec<HeadMeta>,
        built: Built,
    ) -> Result<Self> {
        let page_rows = tier.pools()[0].page_rows;
        let pending = Pending {
            per_layer: vec![0; config.layers],
            failures: Vec::with_capacity(config.queue_capacity),
        };
        let shared = Arc::new(Shared {
            tier,
            kv_heads: config.attn.kv_heads(),
            page_rows,
            layers: built.layers.into_iter().map(RwLock::new).collect(),
            host: built.host,
            pending: Mutex::new(pending),
            done: Condvar::new(),
        });
        let (tx, rx) = crossbeam::channel::bounded(config.queue_capacity);
        let worker_shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("kv-tiered-recall".into())
            .spawn(move || worker_loop(worker_shared, rx))
            .map_err(|e| param("TieredStore::prefill", "recall worker", e, "a spawnable thread"))?;
        let (counts, mut run) = (built.counts, built.run);
        run.policy = policy.name().to_string();
        let full = (config.total_kv_heads() * config.layout.audio_len()) as f64;
        run.prefill_r_gpu = counts.device_audio as f64 / full;
        run.prefill_r_gpu_cpu = (counts.device_audio + counts.host_only_audio) as f64 / full;
        let (d, kv) = (config.rows.head_dim, config.attn.kv_heads());
        let queries = match policy.step_signal() {
            StepSignal::Queries => config.layers * config.attn.q_heads() * d,
            _ => 0,
        };
        let cap = config.queue_capacity;
        Ok(Self {
            tables: config.rows.code_tables(),
            policy,
            shared,
            heads,
            residency: built.residency,
            counts,
            appended: vec![0; config.layers],
            step: 0,
            anchor_acc: vec![0.0; config.layout.audio_len()],
            anchor_seen: false,
            queries: vec![0.0; queries],
            queries_seen: 0,
            enc: AppendBufs {
                keys: Vec::with_capacity(4 * d * kv),
                values: Vec::with_capacity(4 * d * kv),
                topk: Vec::with_capacity(d),
                slots: Vec::with_capacity(kv),
            },
            plan: StepPlan { recalls: Vec::with_capacity(cap), releases: Vec::with_capacity(cap) },
            jobs_buf: Vec::with_capacity(cap),
            jobs: Some(tx),
            worker: Some(worker),
            last: StepMetrics::default(),
            run,
            config,
        })
    }
}

fn check_tier<T: Tier>(config: &StoreConfig, tier: &T, unit: usize) -> Result<()> {
    const OP: &str = "TieredStore::prefill";
    if unit == 0 {
        return Err(param(OP, "policy.unit_len", 0, "≥ 1"));
    }
    let want = config.pool_specs(unit);
    let got = tier.pools();
    let ok = tier.layers() == config.layers
        && got.len() >= want.len()
        && got.iter().zip(&want).all(|(g, w)| {
            g.key_row_bytes == w.key_row_bytes
                && g.value_row_bytes == w.value_row_bytes
                && g.page_rows >= unit
                && g.page_rows == got[0].page_rows
        });
    if ok {
        Ok(())
    } else {
        Err(param(
            OP,
            "tier pools",
            format!("{got:?} over {} layers", tier.layers()),
            "StoreConfig::pool_specs(policy.unit_len) over config.layers",
        ))
    }
}

fn check_kv(config: &StoreConfig, kv: &dyn PromptKv) -> Result<()> {
    const OP: &str = "TieredStore::prefill";
    let n = config.layout.seq_len() * config.rows.head_dim;
    for l in 0..config.layers {
        for k in 0..config.attn.kv_heads() {
            check_len(OP, "keys", kv.keys(l, k), n)?;
            check_len(OP, "values", kv.values(l, k), n)?;
            check_finite(OP, "keys", kv.keys(l, k))?;
            check_finite(OP, "values", kv.values(l, k))?;
        }
    }
    Ok(())
}

fn check_prefill_scores(config: &StoreConfig, signal: PrefillSignal, scores: &[f32]) -> Result<()> {
    const OP: &str = "TieredStore::prefill";
    let n = match signal {
        PrefillSignal::None if scores.is_empty() => return Ok(()),
        _ => config.total_kv_heads() * config.layout.audio_len(),
    };
    check_len(OP, "scores", scores, n)?;
    check_scores(OP, "scores", scores)
}

fn check_plans(plans: &[HeadPlan], config: &StoreConfig, unit: usize) -> Result<()> {
    const OP: &str = "Policy::plan_prefill";
    check_len(OP, "plans", plans, config.total_kv_heads())?;
    let t = config.layout.audio_len();
    let units = t.div_ceil(unit) as u32;
    let mut mark = vec![false; t];
    let bad = |what: &'static str, h: usize| {
        param(OP, what, format!("head {h}"), "sorted, unique, in range, device ∩ host = ∅")
    };
    for (h, p) in plans.iter().enumerate() {
        mark.fill(false);
        for list in [&p.device, &p.host] {
            if !list.windows(2).all(|w| w[0] < w[1])
                || list.last().is_some_and(|&i| i as usize >= t)
            {
                return Err(bad("device/host", h));
            }
            for &i in list.iter() {
                if std::mem::replace(&mut mark[i as usize], true) {
                    return Err(bad("device ∩ host", h));
                }
            }
        }
        if !p.pooled.is_empty() {
            let fits = p.pooled.len() == p.device.len()
                && p.device.iter().zip(&p.pooled).enumerate().all(|(i, (&d, &n))| {
                    let end = d as usize + n as usize;
                    n >= 1
                        && end <= t
                        && p.device.get(i + 1).is_none_or(|&next| end <= next as usize)
                        && (d as usize + 1..end).all(|m| !mark[m])
                });
            if !fits {
                return Err(param(
                    OP,
                    "pooled",
                    format!("head {h}"),
                    "one run ≥ 1 per device row, inside the audio, disjoint from the next row and from host",
                ));
            }
        }
        let ir = &p.initially_resident;
        if !ir.windows(2).all(|w| w[0] < w[1]) || ir.last().is_some_and(|&u| u >= units) {
            return Err(bad("initially_resident", h));
        }
    }
    Ok(())
}
