//! Tile-level kernels: the inner loops of every decode kernel, one tile of up to
//! [`TILE`] rows at a time, dispatched to the AVX2 or the portable implementation (and,
//! for the dense and coded-row products, to the AVX-512 one where [`crate::Isa::Avx512`]
//! was chosen).
//!
//! Layouts shared by all kernels (SWAN method section: the sparse-dense products of the
//! scores `q̂·k_j` and of the output `Σ a_j v_j`; online softmax so that the sparse history
//! and the dense buffer share one normaliser):
//! * scores and probabilities of a tile: `s[t][lane]` — one lane per q-head of a GQA group
//!   (`W` = 4 or 8 lanes), in the base-2 log domain (queries carry a factor `log2 e`);
//! * dense queries and accumulators: head-major, `heads × d`;
//! * sparse queries and accumulators: *transposed*, `[dim][lane]`, so one index of a sparse
//!   row fetches the query values of every q-head of the group in one load, and one
//!   scatter updates the accumulators of every q-head — one pass over a row serves the
//!   whole group;
//! * a sparse tile: the entries of up to [`TILE`] rows — consecutive rows of one CSR block,
//!   or slab rows of a tiered store — values decoded to `f32` or raw fp8 codes, row `t`
//!   spanning entries `spans[t].0..spans[t].1` of the tile's index and value slices.

use kv_sparse::{SparseIndex, Value};

use super::portable;

/// Rows per tile.
pub(crate) const TILE: usize = 32;
/// Most q-heads one pass serves (lanes of the widest tile).
pub(crate) const MAX_LANES: usize = 8;
/// Most heads one dense pass keeps in registers.
pub(crate) const DENSE_PASS: usize = 4;

/// The values of a sparse tile: decoded to `f32`, or raw fp8 codes that the kernels decode
/// through `kv_sparse::fp8::DECODE_TABLE` as they go (one table load per entry is cheaper
/// than a separate decoding pass).
#[derive(Clone, Copy)]
pub(crate) enum TileValues<'a> {
    /// Decoded values.
    F32(&'a [f32]),
    /// fp8 E4M3FN codes.
    Fp8(&'a [u8]),
}

impl TileValues<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Fp8(v) => v.len(),
        }
    }

    /// Value `j`, decoded (`j < len()`).
    pub fn get(&self, j: usize) -> f32 {
        match self {
            Self::F32(v) => v[j],
            Self::Fp8(v) => kv_sparse::fp8::DECODE_TABLE[usize::from(v[j])],
        }
    }
}

/// Entries of up to [`TILE`] sparse rows.
pub(crate) struct SparseTile<'a, I> {
    /// Indices; row `t`'s are `idx[spans[t].0..spans[t].1]`.
    pub idx: &'a [I],
    /// Values, one per index (same positions as `idx`).
    pub val: TileValues<'a>,
    /// Entry range of each row.
    pub spans: &'a [(usize, usize)],
}

impl<I> SparseTile<'_, I> {
    /// Rows in the tile.
    pub fn rows(&self) -> usize {
        self.spans.len()
    }

    /// Row `t`'s entries as a range into `idx` / `val`.
    pub fn entries(&self, t: usize) -> std::ops::Range<usize> {
        self.spans[t].0..self.spans[t].1
    }
}

/// Proof that this CPU runs AVX2 + FMA + F16C + POPCNT code: only [`Kernels::new`] makes one, after
/// run-time detection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2Token {
    /// The CPU also runs AVX-512 F + BW + VBMI2 code (checked likewise), and it was asked for.
    vbmi2: bool,
    /// The 512-bit products were asked for (implies `vbmi2`).
    avx512: bool,
    /// Integer score products with int8 queries were asked for.
    int8: bool,
    /// They run on AVX-512 VNNI: the CPU runs AVX-512 VNNI and VL (checked likewise), and
    /// `avx512` and `int8` hold.
    vnni: bool,
}

impl Avx2Token {
    /// Whether bitmask rows may be placed with AVX-512 VBMI2.
    pub fn vbmi2(self) -> bool {
        self.vbmi2
    }

    /// Whether the dense and coded-row products may run on AVX-512 F + BW.
    pub fn avx512(self) -> bool {
        self.avx512
    }

    /// Whether int8 keys score by AVX-512 VNNI products with int8 queries (otherwise by
    /// AVX2's, where int8 queries were asked for).
    pub fn vnni(self) -> bool {
        self.vnni
    }
}

/// The implementation the tile kernels dispatch to.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kernels {
    /// AVX2 + FMA + F16C + POPCNT, proven available by the token.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Avx2(Avx2Token),
    /// Portable Rust.
    Portable,
}

impl Kernels {
    /// Kernels for `isa`, or `None` when this CPU cannot run it.
    pub fn new(isa: crate::Isa) -> Option<Self> {
        match isa {
            crate::Isa::Portable => Some(Self::Portable),
            crate::Isa::Avx2 | crate::Isa::Avx2Vbmi2 | crate::Isa::Avx512 => {
                let avx512 = isa == crate::Isa::Avx512;
                let vbmi2 = avx512 || isa == crate::Isa::Avx2Vbmi2;
                let token = Avx2Token { vbmi2, avx512, int8: false, vnni: false };
                isa.is_available().then_some(Self::Avx2(token))
            }
        }
    }

    /// The same kernels with int8 queries on (`on`) or off: where on, keys of int8 and
    /// 4-bit codes score by integer products with the queries rounded to int8
    /// ([`super::qcodes`]) — AVX-512 VNNI's where the kernels run the 512-bit products on a
    /// CPU with AVX-512 VNNI and VL, AVX2's otherwise. `None` when asked on for the
    /// portable kernels.
    pub fn with_int8_queries(self, on: bool) -> Option<Self> {
        match self {
            Self::Avx2(t) if !on => Some(Self::Avx2(Avx2Token { int8: false, vnni: false, ..t })),
            Self::Portable if !on => Some(self),
            Self::Avx2(t) => {
                #[cfg(target_arch = "x86_64")]
                let vnni = t.avx512
                    && std::arch::is_x86_feature_detected!("avx512vnni")
                    && std::arch::is_x86_feature_detected!("avx512vl");
                #[cfg(not(target_arch = "x86_64"))]
                let vnni = false;
                Some(Self::Avx2(Avx2Token { int8: true, vnni, ..t }))
            }
            Self::Portable => None,
        }
    }

    /// Whether int8 keys score against int8 queries ([`Kernels::with_int8_queries`]).
    pub fn int8_queries(self) -> bool {
        matches!(self, Self::Avx2(t) if t.int8)
    }

    /// The instruction set these kernels use.
    pub fn isa(self) -> crate::Isa {
        match self {
            Self::Avx2(t) if t.avx512 => crate::Isa::Avx512,
            Self::Avx2(t) if t.vbmi2 => crate::Isa::Avx2Vbmi2,
            Self::Avx2(_) => crate::Isa::Avx2,
            Self::Portable => crate::Isa::Portable,
        }
    }
}

macro_rules! dispatch {
    ($k:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $k {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an `Avx2Token` exists only after `Isa::Avx2.is_available()` returned
            // true, so the CPU supports every feature the `avx2` functions enable.
            Kernels::Avx2(_) => unsafe { super::avx2::$f($($arg),*) },
            _ => portable::$f($($arg),*),
        }
    };
}

impl Kernels {
    /// `s[t][lane0 + h] = q_h · rows[t]` for the `heads` (≤ [`DENSE_PASS`]) head-major
    /// queries in `q` (`heads × d`).
    pub fn dense_scores<D: Value, const W: usize>(
        self,
        q: &[f32],
        d: usize,
        rows: &[&[D]],
        lane0: usize,
        s: &mut [[f32; W]],
    ) {
        let heads = q.len() / d;
        assert!(heads <= DENSE_PASS && lane0 + heads <= W && s.len() >= rows.len());
        assert!(rows.iter().all(|r| r.len() >= d));
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self
            && t.avx512()
            && super::avx512::dense_supported::<D>(d)
        {
            // SAFETY: a token with `avx512` exists only after `Isa::Avx512.is_available()`
            // returned true, so the CPU supports AVX-512 F + BW + VBMI2, AVX2, FMA, F16C and
            // POPCNT.
            return unsafe { super::avx512::dense_scores(q, d, rows, lane0, s) };
        }
        dispatch!(self, dense_scores(q, d, rows, lane0, s))
    }

    /// `acc_h = factor[lane0 + h] · acc_h + Σ_t p[t][lane0 + h] · rows[t]` for the `heads`
    /// head-major accumulators in `acc` (`heads × d`).
    pub fn dense_accumulate<D: Value, const W: usize>(
        self,
        p: &[[f32; W]],
        rows: &[&[D]],
        lane0: usize,
        factor: &[f32; W],
        acc: &mut [f32],
        d: usize,
    ) {
        let heads = acc.len() / d;
        assert!(heads <= DENSE_PASS && lane0 + heads <= W && p.len() >= rows.len());
        assert!(rows.iter().all(|r| r.len() >= d));
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self
            && t.avx512()
            && super::avx512::dense_supported::<D>(d)
        {
            // SAFETY: as in `dense_scores`.
            return unsafe { super::avx512::dense_accumulate(p, rows, lane0, factor, acc, d) };
        }
        dispatch!(self, dense_accumulate(p, rows, lane0, factor, acc, d))
    }

    /// `s[t][·] = Σ_{(i, x) ∈ row t} qt[i][·] · x` (transposed queries, `qt.len() ≥` the
    /// index type's range so that no index can fall outside).
    pub fn sparse_scores<I: SparseIndex, const W: usize>(
        self,
        qt: &[[f32; W]],
        tile: &SparseTile<'_, I>,
        s: &mut [[f32; W]],
    ) {
        check_sparse(qt.len(), tile, s.len());
        dispatch!(self, sparse_scores(qt, tile, s))
    }

    /// `acc[i][·] += p[t][·] · x` for every entry `(i, x)` of every row `t`.
    pub fn sparse_accumulate<I: SparseIndex, const W: usize>(
        self,
        p: &[[f32; W]],
        tile: &SparseTile<'_, I>,
        acc: &mut [[f32; W]],
    ) {
        check_sparse(acc.len(), tile, p.len());
        dispatch!(self, sparse_accumulate(p, tile, acc))
    }

    /// Online-softmax update with a tile of log2-domain scores: raises the running maxima
    /// `m`, turns `s` into `2^(s − m)`, updates the running sums `l`, and returns the factor
    /// `2^(m_old − m_new)` every lane's accumulator must be multiplied by.
    pub fn softmax_update<const W: usize>(
        self,
        m: &mut [f32; W],
        l: &mut [f32; W],
        s: &mut [[f32; W]],
    ) -> [f32; W] {
        dispatch!(self, softmax_update(m, l, s))
    }

    /// Decodes `src` into `dst[..src.len()]`.
    pub fn decode<V: Value>(self, src: &[V], dst: &mut [f32]) {
        assert!(dst.len() >= src.len());
        dispatch!(self, decode(src, dst))
    }
}

fn check_sparse<I: SparseIndex>(table_rows: usize, tile: &SparseTile<'_, I>, tile_rows: usize) {
    assert!(table_rows >= I::MAX_HEAD_DIM, "transposed table must cover every index value");
    assert!(tile.idx.len() == tile.val.len() && tile_rows >= tile.rows());
    assert!(tile.spans.iter().all(|&(a, b)| a <= b && b <= tile.idx.len()));
}

/// Asks the CPU to bring every cache line of `data` into L1 ahead of use (a hint: it never
/// faults and changes no result). The segments issue it for the rows of the tile after the
/// one they compute when those rows do not lie in [`one_span`], so that the next rows'
/// memory latency overlaps this tile's arithmetic.
#[inline]
pub(crate) fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = std::mem::size_of_val(data);
        if bytes == 0 {
            return;
        }
        let start = data.as_ptr().cast::<i8>();
        // Every 64th byte, then the last: together they touch every line `data` spans.
        for offset in (0..bytes).step_by(64).chain([bytes - 1]) {
            // SAFETY: a prefetch is a hint that never faults and reads nothing the program
            // can observe; `offset < bytes`, so the address lies inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Whether the `rows` rows `first ..= last` lie in order in one stretch of memory no longer
/// than twice their bytes — back to back, or with small gaps such as a per-row scale. The
/// segments leave such rows to the hardware prefetcher, which streams them (on an AVX-512
/// EPYC a software prefetch of the whole next tile as one span made every format slower on
/// one thread, dense f16 rows up to 1.5×: a burst of 64–128 line hints stalls on the core's
/// miss buffers; only bitmask rows at d = 64 on two threads gained from it, 2–8 %); rows
/// spread over two buffers, or gathered, are prefetched one by one with [`prefetch`].
pub(crate) fn one_span<T>(first: &[T], last: &[T], rows: usize) -> bool {
    let row = std::mem::size_of_val(first);
    let (a, b) = (first.as_ptr() as usize, last.as_ptr() as usize);
    let Some(gap) = b.checked_sub(a) else {
        return false;
    };
    rows > 0 && last.len() == first.len() && gap <= 2 * (rows - 1) * row
}

/// `acc[i][·] *= factor[·]` over the first `rows` rows, skipped when every factor is 1.
pub(crate) fn rescale_rows<const W: usize>(acc: &mut [[f32; W]], factor: &[f32; W]) {
    if factor.iter().all(|&f| f == 1.0) {
        return;
    }
    for row in acc {
        for (a, f) in row.iter_mut().zip(factor) {
            *a *= f;
        }
    }
}
