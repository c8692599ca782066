//! Views for attention (WnW §2.3: attention reads only the resident KV): per kv-head, the
//! resident positions in ascending order and the arena row holding each, borrowed straight
//! from the residency tables and the tier's arena — no copy, no allocation.
//!
//! Row `r` of a dense arena is `keys[r·head_dim..(r+1)·head_dim]` (the `rows` list indexes
//! it), matching the gathered kernels' "arena + per-head row list" input (`attn-kernels` `DenseHeads` with
//! gathered rows; a layer-wide arena means the per-head arena capacity is 0 there, i.e. row ids
//! are absolute). With SWAN sparse rows enabled, a non-exact head's audio rows are in the
//! `sparse` list (pool 1) and its text rows in the `dense` list; the two position lists are
//! disjoint and together form the resident set, attended with one softmax.
//!
//! The view also owns the hand-over to `attn-kernels`: a layer's per-head dense and sparse
//! parts ([`LayerView::gathered_parts_into`]) for its gathered dense + sparse fp8 kernel — or,
//! with coded compact rows, its dense and coded parts ([`LayerView::coded_parts_into`]) for
//! the gathered dense + coded kernel — built each step in a [`GatheredLists`] that survives
//! the step's view, so the decode loop neither densifies a compact row nor allocates
//! ([`LayerView::with_gathered_parts`], [`LayerView::with_coded_parts`]).

use attn_kernels::{GatheredCodedKv, GatheredKv, GatheredSparseKv, SparseSlab};
use kv_sparse::csr::SparseRow;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::{Value, ValueFormat};
use parking_lot::RwLockReadGuard;

use super::TieredStore;
use super::shared::HeadTables;
use crate::error::{Error, Result, param};
use crate::rows::{CodeTables, RowCodec, RowLayout};
use crate::tier::{ArenaRead, Tier};

/// Sorted resident positions and the arena row of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather<'v> {
    /// Absolute positions, strictly ascending.
    pub positions: &'v [u32],
    /// Arena row of each position.
    pub rows: &'v [u32],
}

/// Read access to one layer: residency tables and arenas, locked for the view's lifetime.
pub struct LayerView<'a, T: Tier> {
    tables: RwLockReadGuard<'a, Vec<HeadTables>>,
    arenas: [Option<T::Arena<'a>>; 2],
    rows: RowLayout,
    codes: &'a CodeTables,
}

impl<T: Tier> TieredStore<T> {
    /// Read access to `layer` for attention. Blocks until the recalls issued for this layer
    /// have landed (recalls of later layers keep running).
    ///
    /// # Errors
    /// [`Error::HeadOutOfRange`] for a bad layer; [`Error::WorkerStopped`] if the recall
    /// worker died.
    pub fn layer_view(&self, layer: usize) -> Result<LayerView<'_, T>> {
        self.check_head("TieredStore::layer_view", layer, 0)?;
        self.shared
            .wait_until(|p| p.per_layer[layer] == 0, || self.worker_alive())
            .map_err(|pending| Error::WorkerStopped { pending })?;
        let tables = self.shared.layers[layer].read();
        let tier = self.shared.tier.as_ref();
        let sparse = self.config.rows.sparse.is_some().then(|| tier.arena(1, layer));
        Ok(LayerView {
            tables,
            arenas: [Some(tier.arena(0, layer)), sparse],
            rows: self.config.rows,
            codes: &self.tables,
        })
    }
}

impl<'a, T: Tier> LayerView<'a, T> {
    /// KV-heads in the layer (`kv_heads`).
    pub fn kv_heads(&self) -> usize {
        self.tables.len()
    }

    /// The view of one kv-head (`None` if out of range).
    pub fn head(&self, kv_head: usize) -> Option<HeadView<'_, T::Arena<'a>>> {
        let t = self.tables.get(kv_head)?;
        let g = |p: usize| Gather { positions: t.lists[p].positions(), rows: t.lists[p].rows() };
        Some(HeadView {
            dense: g(0),
            sparse: g(1),
            dense_arena: self.arenas[0].as_ref()?,
            sparse_arena: self.arenas[1].as_ref(),
            rows: self.rows,
            codes: self.codes,
        })
    }

    /// Every kv-head's dense rows as `attn_kernels::GatheredKv` (slab = this layer's dense
    /// arena, slots = the row lists), ready for `DecodeAttention::gathered` — nothing is
    /// copied. `out` is cleared first; reuse it to avoid allocating.
    ///
    /// # Errors
    /// [`Error::Param`] if `D` is not the dense format, the arena is device memory, or a head
    /// has SWAN sparse rows (those need a kernel over [`HeadView::sparse`]).
    pub fn gathered_into<'s, D: Value>(&'s self, out: &mut Vec<GatheredKv<'s, D>>) -> Result<()> {
        out.clear();
        for k in 0..self.kv_heads() {
            let view = self
                .head(k)
                .ok_or_else(|| param("LayerView::gathered_into", "kv_head", k, "in range"))?;
            if !view.sparse.positions.is_empty() {
                return Err(param(
                    "LayerView::gathered_into",
                    "sparse rows",
                    view.sparse.positions.len(),
                    "0 (use HeadView::sparse_key/sparse_value)",
                ));
            }
            out.push(view.gathered().ok_or_else(|| {
                param(
                    "LayerView::gathered_into",
                    "D",
                    D::FORMAT,
                    "the dense format of a host arena",
                )
            })?);
        }
        Ok(())
    }

    /// Every kv-head's resident rows as the two parts of
    /// `attn_kernels::GatheredCodedAttention::gathered_coded`: its dense rows (`dense[h]`) and
    /// its coded rows (`coded[h]`, layouts over the compact arena's key/value bytes, read in
    /// place). A head without coded rows gets an empty coded part; the kernel's `weights`
    /// (per head: dense rows, then coded rows) feed [`TieredStore::add_gathered_weights`]
    /// unchanged. Both vectors are cleared first; reuse them to avoid allocating.
    ///
    /// # Errors
    /// [`Error::Param`] if `D` is not the dense format, an arena is device memory, or the
    /// compact rows are SWAN sparse rows (use [`LayerView::gathered_parts_into`]).
    pub fn coded_parts_into<'s, D: Value>(
        &'s self,
        dense: &mut Vec<GatheredKv<'s, D>>,
        coded: &mut Vec<GatheredCodedKv<'s>>,
    ) -> Result<()> {
        let op = "LayerView::coded_parts_into";
        let names = ("sparse or device", "coded rows in host memory");
        self.parts_into(op, (dense, coded), |v| v.gathered_coded(), names)
    }

    /// Runs `attend` over every kv-head's resident rows laid out as
    /// [`LayerView::coded_parts_into`] lays them out (dense parts, coded parts), in `lists`'
    /// storage — the per-step form for stores with coded compact rows, as
    /// [`LayerView::with_gathered_parts`] is for SWAN rows.
    ///
    /// # Errors
    /// As [`LayerView::coded_parts_into`]; `attend` is not called then.
    pub fn with_coded_parts<D: Value, R>(
        &self,
        lists: &mut GatheredLists<D>,
        attend: impl FnOnce(&[GatheredKv<'_, D>], &[GatheredCodedKv<'_>]) -> R,
    ) -> Result<R> {
        let mut dense: Vec<GatheredKv<'_, D>> = std::mem::take(&mut lists.dense);
        let mut coded: Vec<GatheredCodedKv<'_>> = std::mem::take(&mut lists.coded);
        let result = self.coded_parts_into(&mut dense, &mut coded).map(|()| attend(&dense, &coded));
        lists.dense = recycle(dense);
        lists.coded = recycle(coded);
        result
    }

    /// Every kv-head's resident rows as the two parts of
    /// `attn_kernels::GatheredSparseAttention::gathered_sparse`: its dense rows (`dense[h]`,
    /// slab = the dense arena) and its SWAN sparse fp8 rows (`sparse[h]`, slabs = the sparse
    /// arena's key/value bytes, read in place — nothing is copied or densified). A head
    /// without sparse rows gets an empty sparse part. The kernel's `weights` (per head: dense
    /// rows, then sparse rows) feed [`TieredStore::add_gathered_weights`] unchanged.
    /// Both vectors are cleared first; reuse them to avoid allocating.
    ///
    /// # Errors
    /// [`Error::Param`] if `D` is not the dense format, an arena is device memory, or the
    /// compact rows are coded (use [`LayerView::coded_parts_into`]).
    pub fn gathered_parts_into<'s, D: Value>(
        &'s self,
        dense: &mut Vec<GatheredKv<'s, D>>,
        sparse: &mut Vec<GatheredSparseKv<'s>>,
    ) -> Result<()> {
        let op = "LayerView::gathered_parts_into";
        let names = ("coded or device", "SWAN sparse rows in host memory");
        self.parts_into(op, (dense, sparse), |v| v.gathered_sparse(), names)
    }

    /// Every kv-head's dense part and compact part (`part` of its view; `got` and
    /// `expected` name the compact rows in the error when it gives none), both vectors
    /// cleared first.
    fn parts_into<'s, D: Value, P>(
        &'s self,
        op: &'static str,
        (dense, parts): (&mut Vec<GatheredKv<'s, D>>, &mut Vec<P>),
        part: impl Fn(&HeadView<'s, T::Arena<'a>>) -> Option<P>,
        (got, expected): (&'static str, &'static str),
    ) -> Result<()> {
        dense.clear();
        parts.clear();
        for k in 0..self.kv_heads() {
            let view = self.head(k).ok_or_else(|| param(op, "kv_head", k, "in range"))?;
            dense
                .push(view.gathered().ok_or_else(|| {
                    param(op, "D", D::FORMAT, "the dense format of a host arena")
                })?);
            parts.push(part(&view).ok_or_else(|| param(op, "compact rows", got, expected))?);
        }
        Ok(())
    }

    /// Runs `attend` over every kv-head's resident rows laid out as
    /// [`LayerView::gathered_parts_into`] lays them out (dense parts, sparse parts), both
    /// lists built in `lists`' storage, which keeps its capacity from one call to the next
    /// although each call's lists borrow that call's view — the per-step form for decode
    /// loops: nothing is copied or densified, and nothing is allocated once `lists` has held
    /// `kv_heads` entries. Returns what `attend` returns (typically
    /// `attn_kernels::GatheredSparseAttention::gathered_sparse`'s own result).
    ///
    /// # Errors
    /// As [`LayerView::gathered_parts_into`]; `attend` is not called then.
    ///
    /// # Examples
    /// ```
    /// # use kv_tiered::{AudioLayout, DensePromptKv, GatheredLists, StoreConfig, TieredStore};
    /// # use kv_tiered::policy::FullPolicy;
    /// use attn_kernels::{AttnConfig, CpuAttention, GatheredSparseAttention};
    /// // One layer, one kv-head, head_dim 4, a 12-token prompt with audio at 2..10.
    /// let layout = AudioLayout::new(12, 2..10, 4, 8)?;
    /// let kv = DensePromptKv::new(1, 1, 12, 4, vec![0.25; 48], vec![1.0; 48])?;
    /// let cfg = AttnConfig::new(1, 1, 4)?;
    /// let config = StoreConfig::new(1, cfg, layout, 4);
    /// let store = TieredStore::prefill_host(config, Box::new(FullPolicy), &kv, &[])?;
    /// let mut cpu = CpuAttention::new(1)?;
    /// let (mut lists, mut out) = (GatheredLists::<f32>::with_capacity(1), [0.0f32; 4]);
    /// let view = store.layer_view(0)?;
    /// view.with_gathered_parts(&mut lists, |dense, sparse| {
    ///     cpu.gathered_sparse(&cfg, &[1.0; 4], dense, sparse, &mut out, None)
    /// })?
    /// .unwrap();
    /// assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6)); // every value row is 1
    /// # Ok::<(), kv_tiered::Error>(())
    /// ```
    pub fn with_gathered_parts<D: Value, R>(
        &self,
        lists: &mut GatheredLists<D>,
        attend: impl FnOnce(&[GatheredKv<'_, D>], &[GatheredSparseKv<'_>]) -> R,
    ) -> Result<R> {
        let mut dense: Vec<GatheredKv<'_, D>> = std::mem::take(&mut lists.dense);
        let mut sparse: Vec<GatheredSparseKv<'_>> = std::mem::take(&mut lists.sparse);
        let result =
            self.gathered_parts_into(&mut dense, &mut sparse).map(|()| attend(&dense, &sparse));
        lists.dense = recycle(dense);
        lists.sparse = recycle(sparse);
        result
    }

    /// Concatenates every head's `pool` lists into `positions`/`rows` with `offsets`
    /// (`kv_heads + 1` entries), the batched layout of the GPU gathered kernel. Reuses the
    /// vectors' capacity.
    pub fn concat_lists(
        &self,
        pool: usize,
        positions: &mut Vec<u32>,
        rows: &mut Vec<u32>,
        offsets: &mut Vec<u32>,
    ) {
        positions.clear();
        rows.clear();
        offsets.clear();
        offsets.push(0);
        for t in self.tables.iter() {
            if let Some(l) = t.lists.get(pool) {
                positions.extend_from_slice(l.positions());
                rows.extend_from_slice(l.rows());
            }
            offsets.push(positions.len() as u32);
        }
    }
}

/// Storage for the per-kv-head lists of [`LayerView::with_gathered_parts`] that outlives
/// every view: the lists borrow one step's view, the allocation stays for the next step.
#[derive(Debug)]
pub struct GatheredLists<D: Value> {
    dense: Vec<GatheredKv<'static, D>>,
    sparse: Vec<GatheredSparseKv<'static>>,
    coded: Vec<GatheredCodedKv<'static>>,
}

impl<D: Value> Default for GatheredLists<D> {
    fn default() -> Self {
        Self { dense: Vec::new(), sparse: Vec::new(), coded: Vec::new() }
    }
}

impl<D: Value> GatheredLists<D> {
    /// Room for `kv_heads` kv-heads, so that not even the first step allocates.
    pub fn with_capacity(kv_heads: usize) -> Self {
        Self {
            dense: Vec::with_capacity(kv_heads),
            sparse: Vec::with_capacity(kv_heads),
            coded: Vec::with_capacity(kv_heads),
        }
    }
}

/// An empty vector in `v`'s allocation, for an element type that differs from `v`'s in
/// lifetimes only: `Vec`'s `into_iter().collect()` runs in place when the element layouts
/// agree, so no allocation is made (`tests/alloc_free.rs` checks it).
fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// One kv-head's resident KV. See the module documentation.
pub struct HeadView<'v, A> {
    /// Rows in the dense pool (text, generated tokens, exact heads' audio).
    pub dense: Gather<'v>,
    /// Rows in the compact pool (audio of non-exact heads when SWAN or coded rows are on;
    /// else empty).
    pub sparse: Gather<'v>,
    dense_arena: &'v A,
    sparse_arena: Option<&'v A>,
    rows: RowLayout,
    codes: &'v CodeTables,
}

impl<'v, A: ArenaRead> HeadView<'v, A> {
    /// Resident positions in total.
    pub fn len(&self) -> usize {
        self.dense.positions.len() + self.sparse.positions.len()
    }
    /// Whether nothing is resident.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.rows.head_dim
    }
    /// Storage format of dense rows.
    pub fn dense_format(&self) -> ValueFormat {
        self.rows.dense
    }
    /// The arenas (dense, sparse) for device-side kernels.
    pub fn arenas(&self) -> (&'v A, Option<&'v A>) {
        (self.dense_arena, self.sparse_arena)
    }

    fn typed<D: Value>(&self, values: bool) -> Option<&'v [D]> {
        if D::FORMAT != self.rows.dense {
            return None;
        }
        let (k, v) = self.dense_arena.host_bytes()?;
        bytemuck::try_cast_slice(if values { v } else { k }).ok()
    }
    /// The whole dense key arena as `D` values (row `r` at `r·head_dim`); `None` if `D` is not the
    /// dense format or the arena is device memory.
    pub fn dense_keys<D: Value>(&self) -> Option<&'v [D]> {
        self.typed(false)
    }
    /// The whole dense value arena (see [`dense_keys`](Self::dense_keys)).
    pub fn dense_values<D: Value>(&self) -> Option<&'v [D]> {
        self.typed(true)
    }

    /// The dense rows as an `attn_kernels::GatheredKv` (no copy); `None` if `D` is not the
    /// dense format or the arena is device memory.
    pub fn gathered<D: Value>(&self) -> Option<GatheredKv<'v, D>> {
        let (k, v) = (self.dense_keys::<D>()?, self.dense_values::<D>()?);
        Some(GatheredKv::with_slots(
            self.rows.head_dim,
            self.dense.positions,
            self.dense.rows,
            k,
            v,
        ))
    }

    /// The SWAN sparse rows as an `attn_kernels::GatheredSparseKv` over the sparse arena's
    /// bytes (no copy; each slab row is `k` u8 indices then `k` fp8 codes, exactly
    /// [`RowCodec::SparseFp8`]). Empty when the head holds no sparse rows; `None` if it does
    /// but the sparse arena is device memory.
    pub fn gathered_sparse(&self) -> Option<GatheredSparseKv<'v>> {
        let d = self.rows.head_dim;
        let slab = |c: RowCodec, bytes: &'v [u8]| match c {
            RowCodec::SparseFp8 { k, scale } => SparseSlab::new(bytes, k, scale),
            _ => SparseSlab::new(&[], 0, 1.0),
        };
        if self.sparse.positions.is_empty() {
            let empty = SparseSlab::new(&[], 0, 1.0);
            return Some(GatheredSparseKv::new(d, &[], empty, empty));
        }
        let (kc, vc) = self.rows.sparse.filter(|_| !self.rows.is_coded())?;
        let (kb, vb) = self.sparse_arena?.host_bytes()?;
        Some(GatheredSparseKv::with_slots(
            d,
            self.sparse.positions,
            self.sparse.rows,
            slab(kc, kb),
            slab(vc, vb),
        ))
    }

    /// The coded rows as an `attn_kernels::GatheredCodedKv` over the compact arena's bytes
    /// (no copy; each slab row is one row of the codec's layout). Empty when the head holds
    /// no compact rows; `None` if it does but they are SWAN sparse rows or device memory.
    pub fn gathered_coded(&self) -> Option<GatheredCodedKv<'v>> {
        let d = self.rows.head_dim;
        if self.sparse.positions.is_empty() {
            return Some(GatheredCodedKv::empty(d));
        }
        let (kc, vc) = self.rows.sparse?;
        let (kb, vb) = self.sparse_arena?.host_bytes()?;
        Some(GatheredCodedKv::with_slots(
            d,
            self.sparse.positions,
            self.sparse.rows,
            kc.codes(kb, &self.codes.key_levels, &self.codes.sketch)?,
            vc.codes(vb, &self.codes.value_levels, &[])?,
        ))
    }

    fn sparse_row(&self, i: usize, values: bool) -> Option<(SparseRow<'v, u8, Fp8E4M3>, f32)> {
        let (kc, vc) = self.rows.sparse?;
        let RowCodec::SparseFp8 { k, scale } = (if values { vc } else { kc }) else { return None };
        let (kb, vb) = self.sparse_arena?.host_bytes()?;
        let row = *self.sparse.rows.get(i)? as usize;
        let bytes = if values { vb } else { kb }.get(row * 2 * k..(row + 1) * 2 * k)?;
        let (idx, val) = bytes.split_at(k);
        Some((SparseRow { indices: idx, values: bytemuck::cast_slice(val) }, scale))
    }
    /// Key row of the `i`-th sparse entry and its decode scale.
    pub fn sparse_key(&self, i: usize) -> Option<(SparseRow<'v, u8, Fp8E4M3>, f32)> {
        self.sparse_row(i, false)
    }
    /// Value row of the `i`-th sparse entry and its decode scale.
    pub fn sparse_value(&self, i: usize) -> Option<(SparseRow<'v, u8, Fp8E4M3>, f32)> {
        self.sparse_row(i, true)
    }

    /// Decodes every resident row to f32 in ascending position order (both pools merged)
    /// into caller buffers — for references and tests (this copies; attention reads the
    /// rows in place through [`LayerView::with_gathered_parts`]).
    ///
    /// # Errors
    /// [`Error::Shape`] if the arena is not host-addressable.
    pub fn decode_into(
        &self,
        positions: &mut Vec<u32>,
        keys: &mut Vec<f32>,
        values: &mut Vec<f32>,
    ) -> Result<()> {
        let d = self.rows.head_dim;
        let dense = self.dense_arena.host_bytes().ok_or(crate::Error::Shape {
            op: "HeadView::decode_into",
            what: "host arena",
            expected: 1,
            got: 0,
        })?;
        let sparse = self.sparse_arena.and_then(ArenaRead::host_bytes);
        positions.clear();
        keys.clear();
        values.clear();
        let (mut i, mut j) = (0, 0);
        let (dp, sp) = (self.dense.positions, self.sparse.positions);
        while i < dp.len() || j < sp.len() {
            let from_dense = j >= sp.len() || (i < dp.len() && dp[i] < sp[j]);
            let (pool, idx, bytes) =
                if from_dense { (0, i, dense) } else { (1, j, sparse.unwrap_or(dense)) };
            let (kc, vc) = self.rows.codecs(pool);
            let row =
                if from_dense { self.dense.rows[idx] } else { self.sparse.rows[idx] } as usize;
            let (kr, vr) = (kc.row_bytes(d), vc.row_bytes(d));
            positions.push(if from_dense { dp[idx] } else { sp[idx] });
            let start = keys.len();
            keys.resize(start + d, 0.0);
            values.resize(start + d, 0.0);
            kc.decode(&bytes.0[row * kr..(row + 1) * kr], &mut keys[start..])?;
            vc.decode(&bytes.1[row * vr..(row + 1) * vr], &mut values[start..])?;
            if from_dense { i += 1 } else { j += 1 }
        }
        Ok(())
    }
}
