//! AVX2 + FMA + F16C tile kernels (x86-64), same contracts as [`super::portable`]; layouts
//! in [`super::tile`].
//!
//! Formats are decoded in registers, eight at a time: f16 by `vcvtph2ps`, bf16 by a 16-bit
//! shift, fp8 E4M3FN through f16 (the 7 magnitude bits shifted into an f16, widened and
//! multiplied by 2⁸ — exact for normals and subnormals, no f32 denormal arithmetic; the NaN
//! code kept NaN). Each function is compiled with the features enabled and is called only
//! through [`super::tile::Kernels`], which holds the proof of availability.

use std::any::TypeId;
use std::arch::x86_64::*;

use half::{bf16, f16};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::{SparseIndex, Value};

use super::portable;
use super::tile::{SparseTile, TileValues};

fn same<A: 'static, B: 'static>() -> bool {
    TypeId::of::<A>() == TypeId::of::<B>()
}

/// Decodes 8 fp8 E4M3FN codes (low 8 bytes of `v`): the sign and 7 magnitude bits are
/// placed into an f16 (exponent bias 15 instead of 7, so every E4M3 value — subnormals
/// included — is exactly representable), widened by `vcvtph2ps` and scaled by 2⁸. No f32
/// denormal ever reaches the multiplier: shifting the magnitude straight into an f32 and
/// scaling by 2¹²⁰ would feed the codes with a zero exponent to `vmulps` as denormals,
/// which Zen 3 runs ~3× slower (`results/bench-attn/entry-floor`).
/// The NaN code (magnitude `0x7f`) stays NaN.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn fp8x8(v: __m128i) -> __m256 {
    let b = _mm_cvtepu8_epi16(v);
    let mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    let sign = _mm_slli_epi16::<8>(_mm_and_si128(b, _mm_set1_epi16(0x80)));
    let half = _mm_or_si128(_mm_slli_epi16::<7>(mag), sign);
    let x = _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0));
    let nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    _mm256_or_ps(x, _mm256_castsi256_ps(nan))
}

/// Loads 8 consecutive `D` values at `p` as f32 lanes.
///
/// # Safety
/// `p` must be valid for reading 8 values of `D`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn load8<D: Value>(p: *const D) -> __m256 {
    // SAFETY: each branch reads exactly 8 · size_of::<D>() bytes at `p` (the TypeId test
    // identifies `D`), which the caller guarantees are readable; unaligned loads.
    unsafe {
        if same::<D, f32>() {
            _mm256_loadu_ps(p.cast())
        } else if same::<D, f16>() {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        } else if same::<D, bf16>() {
            let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
        } else if same::<D, Fp8E4M3>() {
            fp8x8(_mm_loadl_epi64(p.cast()))
        } else {
            let mut t = [0.0f32; 8];
            for (i, x) in t.iter_mut().enumerate() {
                *x = (*p.add(i)).to_f32();
            }
            _mm256_loadu_ps(t.as_ptr())
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// `2^x` for `x ≤ 0` (results below 2⁻¹²⁶ flush to 0; NaN stays NaN): round-to-nearest
/// split `x = n + f`, `|f| ≤ ½`, degree-7 Taylor polynomial of `e^(f ln 2)` (truncation
/// error < 6·10⁻⁹), exponent built from `n`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn exp2(x: __m256) -> __m256 {
    const C: [f32; 8] = [
        1.0,
        std::f32::consts::LN_2,
        0.240_226_5,
        0.055_504_11,
        0.009_618_129,
        0.001_333_355_8,
        0.000_154_035_3,
        0.000_015_252_734,
    ];
    // `max(lo, x)` returns `x` when `x` is NaN, so NaN propagates.
    let x = _mm256_max_ps(_mm256_set1_ps(-127.0), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    let mut p = _mm256_set1_ps(C[7]);
    for &c in C[..7].iter().rev() {
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
    }
    let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dense_scores<D: Value, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[&[D]],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    match q.len() / d {
        1 => dense_scores_g::<D, 1, W>(q, d, rows, lane0, s),
        2 => dense_scores_g::<D, 2, W>(q, d, rows, lane0, s),
        3 => dense_scores_g::<D, 3, W>(q, d, rows, lane0, s),
        _ => dense_scores_g::<D, 4, W>(q, d, rows, lane0, s),
    }
}

/// Scores of `G` heads: per row, the row is decoded once per 16 dims and multiplied into
/// all `G` queries (two accumulators per head hide the FMA latency).
#[target_feature(enable = "avx2,fma,f16c")]
fn dense_scores_g<D: Value, const G: usize, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[&[D]],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    let (d16, d8) = (d & !15, d & !7);
    let qp = q.as_ptr();
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        let kp = row.as_ptr();
        let mut a = [[_mm256_setzero_ps(); 2]; G];
        // SAFETY: `Kernels::dense_scores` asserted `q.len() == G·d` and `row.len() ≥ d`;
        // every load covers elements `c..c + 8` with `c + 8 ≤ d8 ≤ d`.
        unsafe {
            let mut c = 0;
            while c < d16 {
                let k0 = load8(kp.add(c));
                let k1 = load8(kp.add(c + 8));
                for (h, ah) in a.iter_mut().enumerate() {
                    let qh = qp.add(h * d + c);
                    ah[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qh), k0, ah[0]);
                    ah[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qh.add(8)), k1, ah[1]);
                }
                c += 16;
            }
            if c < d8 {
                let k0 = load8(kp.add(c));
                for (h, ah) in a.iter_mut().enumerate() {
                    ah[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(h * d + c)), k0, ah[0]);
                }
            }
        }
        let mut sums = [_mm256_setzero_ps(); G];
        for (sh, ah) in sums.iter_mut().zip(&a) {
            *sh = _mm256_add_ps(ah[0], ah[1]);
        }
        store_sums(&sums, &mut st[lane0..lane0 + G]);
        if d8 < d {
            for (h, x) in st[lane0..lane0 + G].iter_mut().enumerate() {
                *x += (d8..d).map(|c| q[h * d + c] * row[c].to_f32()).sum::<f32>();
            }
        }
    }
}

/// Writes the horizontal sum of each vector to `out` (four at once with `hadd`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) fn store_sums<const G: usize>(sums: &[__m256; G], out: &mut [f32]) {
    if let ([a, b, c, d], Some(out4)) = (sums.as_slice(), out.first_chunk_mut::<4>()) {
        let h = _mm256_hadd_ps(_mm256_hadd_ps(*a, *b), _mm256_hadd_ps(*c, *d));
        let r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
        // SAFETY: `out4` holds 4 floats.
        unsafe { _mm_storeu_ps(out4.as_mut_ptr(), r) };
        return;
    }
    for (o, v) in out.iter_mut().zip(sums) {
        *o = hsum(*v);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dense_accumulate<D: Value, const W: usize>(
    p: &[[f32; W]],
    rows: &[&[D]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    match acc.len() / d {
        1 => dense_accumulate_g::<D, 1, W>(p, rows, lane0, factor, acc, d),
        2 => dense_accumulate_g::<D, 2, W>(p, rows, lane0, factor, acc, d),
        3 => dense_accumulate_g::<D, 3, W>(p, rows, lane0, factor, acc, d),
        _ => dense_accumulate_g::<D, 4, W>(p, rows, lane0, factor, acc, d),
    }
}

/// Accumulation of `G` heads: 16 output dims of all heads stay in registers while the
/// tile's rows stream past, so each accumulator is loaded and stored once per tile.
#[target_feature(enable = "avx2,fma,f16c")]
fn dense_accumulate_g<D: Value, const G: usize, const W: usize>(
    p: &[[f32; W]],
    rows: &[&[D]],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    let (d16, d8) = (d & !15, d & !7);
    let mut f = [_mm256_setzero_ps(); G];
    for (h, fh) in f.iter_mut().enumerate() {
        *fh = _mm256_set1_ps(factor[lane0 + h]);
    }
    let ap = acc.as_mut_ptr();
    // SAFETY: `Kernels::dense_accumulate` asserted `acc.len() == G·d` and every
    // `row.len() ≥ d`; every access covers elements `c..c + 8` with `c + 8 ≤ d8 ≤ d`.
    unsafe {
        let mut c = 0;
        while c < d16 {
            let mut a = [[_mm256_setzero_ps(); 2]; G];
            for (h, ah) in a.iter_mut().enumerate() {
                ah[0] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c)), f[h]);
                ah[1] = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c + 8)), f[h]);
            }
            for (pt, row) in p.iter().zip(rows) {
                let vp = row.as_ptr().add(c);
                let (v0, v1) = (load8(vp), load8(vp.add(8)));
                for (h, ah) in a.iter_mut().enumerate() {
                    let w = _mm256_set1_ps(pt[lane0 + h]);
                    ah[0] = _mm256_fmadd_ps(w, v0, ah[0]);
                    ah[1] = _mm256_fmadd_ps(w, v1, ah[1]);
                }
            }
            for (h, ah) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(h * d + c), ah[0]);
                _mm256_storeu_ps(ap.add(h * d + c + 8), ah[1]);
            }
            c += 16;
        }
        if c < d8 {
            let mut a = [_mm256_setzero_ps(); G];
            for (h, ah) in a.iter_mut().enumerate() {
                *ah = _mm256_mul_ps(_mm256_loadu_ps(ap.add(h * d + c)), f[h]);
            }
            for (pt, row) in p.iter().zip(rows) {
                let v = load8(row.as_ptr().add(c));
                for (h, ah) in a.iter_mut().enumerate() {
                    *ah = _mm256_fmadd_ps(_mm256_set1_ps(pt[lane0 + h]), v, *ah);
                }
            }
            for (h, ah) in a.iter().enumerate() {
                _mm256_storeu_ps(ap.add(h * d + c), *ah);
            }
        }
    }
    for h in 0..G {
        for c in d8..d {
            let x = &mut acc[h * d + c];
            *x = *x * factor[lane0 + h]
                + p.iter().zip(rows).map(|(pt, row)| pt[lane0 + h] * row[c].to_f32()).sum::<f32>();
        }
    }
}

/// A vector of `W` f32 lanes (one per q-head of a lane block): `__m128` for 4, `__m256`
/// for 8. Only used inside functions compiled with AVX2 + FMA.
trait Lanes: Copy {
    const W: usize;
    /// # Safety
    /// AVX2 + FMA available.
    unsafe fn zero() -> Self;
    /// # Safety
    /// `p` readable for `W` floats; AVX2 + FMA available.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// `p` writable for `W` floats; AVX2 + FMA available.
    unsafe fn store(self, p: *mut f32);
    /// # Safety
    /// `p` readable for one float; AVX2 + FMA available.
    unsafe fn splat(p: *const f32) -> Self;
    /// # Safety
    /// AVX2 + FMA available.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// # Safety
    /// AVX2 + FMA available.
    unsafe fn add(a: Self, b: Self) -> Self;
}

impl Lanes for __m128 {
    const W: usize = 4;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees the features.
        unsafe { _mm_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller guarantees `p` and the features.
        unsafe { _mm_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller guarantees `p` and the features.
        unsafe { _mm_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        // SAFETY: the caller guarantees `p` and the features.
        unsafe { _mm_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller guarantees the features.
        unsafe { _mm_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the caller guarantees the features.
        unsafe { _mm_add_ps(a, b) }
    }
}

impl Lanes for __m256 {
    const W: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: the caller guarantees the features.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the caller guarantees `p` and the features.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: the caller guarantees `p` and the features.
        unsafe { _mm256_storeu_ps(p, self) }
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self {
        // SAFETY: the caller guarantees `p` and the features.
        unsafe { _mm256_broadcast_ss(&*p) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the caller guarantees the features.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the caller guarantees the features.
        unsafe { _mm256_add_ps(a, b) }
    }
}

/// Where the kernels read entry values from: decoded floats, or fp8 codes looked up in
/// `DECODE_TABLE` (a broadcast load straight from the 1 KiB table).
#[derive(Clone, Copy)]
enum ValuePtr {
    F32(*const f32),
    Fp8(*const u8),
}

impl ValuePtr {
    fn of(v: TileValues<'_>) -> Self {
        match v {
            TileValues::F32(x) => Self::F32(x.as_ptr()),
            TileValues::Fp8(x) => Self::Fp8(x.as_ptr()),
        }
    }

    /// Entry `j` broadcast to every lane.
    ///
    /// # Safety
    /// `j` is below the tile's value count; AVX2 + FMA available.
    #[inline(always)]
    unsafe fn splat<L: Lanes>(self, j: usize) -> L {
        // SAFETY: `j` is in bounds (caller); a code indexes the 256-entry table.
        unsafe {
            match self {
                Self::F32(p) => L::splat(p.add(j)),
                Self::Fp8(p) => {
                    L::splat(kv_sparse::fp8::DECODE_TABLE.as_ptr().add(usize::from(*p.add(j))))
                }
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sparse_scores<I: SparseIndex, const W: usize>(
    qt: &[[f32; W]],
    tile: &SparseTile<'_, I>,
    s: &mut [[f32; W]],
) {
    let qp = qt.as_ptr().cast::<f32>();
    let vals = ValuePtr::of(tile.val);
    for (t, st) in s[..tile.rows()].iter_mut().enumerate() {
        let e = tile.entries(t);
        let sp = st.as_mut_ptr();
        // SAFETY: `Kernels::sparse_scores` asserted every row's entries lie inside `idx`
        // and `val` and `qt` covers every value of `I`; `W` is the lane count of the
        // vector type chosen, so each table row and `st` hold exactly one vector.
        unsafe {
            match W {
                4 => row_score::<I, __m128>(qp, tile.idx, vals, e, sp),
                8 => row_score::<I, __m256>(qp, tile.idx, vals, e, sp),
                _ => unreachable_lanes(),
            }
        }
    }
}

#[cold]
fn unreachable_lanes() {
    unreachable!("the engine runs lane blocks of 4 or 8 only")
}

/// `Σ qt[idx[j]] · val[j]` over `entries` (one row), stored to `out`. With `u8` indices,
/// eight indices are read in one load and peeled off by shifts.
///
/// # Safety
/// `entries` inside `idx` and the values; every index `< I::MAX_HEAD_DIM` rows of `L::W`
/// floats at `qt`; `out` writable for `L::W` floats; AVX2 + FMA available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_score<I: SparseIndex, L: Lanes>(
    qt: *const f32,
    idx: &[I],
    vals: ValuePtr,
    entries: std::ops::Range<usize>,
    out: *mut f32,
) {
    // SAFETY: see the function contract; each read is within `entries`.
    unsafe {
        let mut a = [L::zero(); 4];
        let mut j = entries.start;
        if same::<I, u8>() {
            let ip = idx.as_ptr().cast::<u8>();
            while j + 8 <= entries.end {
                let mut ix = ip.add(j).cast::<u64>().read_unaligned();
                for u in 0..8 {
                    let q = L::load(qt.add(L::W * (ix & 0xff) as usize));
                    a[u & 3] = L::fmadd(q, vals.splat::<L>(j + u), a[u & 3]);
                    ix >>= 8;
                }
                j += 8;
            }
        }
        while j < entries.end {
            let q = L::load(qt.add(L::W * idx.get_unchecked(j).to_usize()));
            a[0] = L::fmadd(q, vals.splat::<L>(j), a[0]);
            j += 1;
        }
        L::add(L::add(a[0], a[1]), L::add(a[2], a[3])).store(out);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sparse_accumulate<I: SparseIndex, const W: usize>(
    p: &[[f32; W]],
    tile: &SparseTile<'_, I>,
    acc: &mut [[f32; W]],
) {
    let ap = acc.as_mut_ptr().cast::<f32>();
    let vals = ValuePtr::of(tile.val);
    for (t, pt) in p[..tile.rows()].iter().enumerate() {
        let e = tile.entries(t);
        // SAFETY: as in `sparse_scores`, with `acc` covering every value of `I`
        // (asserted by `Kernels::sparse_accumulate`).
        unsafe {
            match W {
                4 => row_scatter::<I, __m128>(ap, tile.idx, vals, e, __m128::load(pt.as_ptr())),
                8 => row_scatter::<I, __m256>(ap, tile.idx, vals, e, __m256::load(pt.as_ptr())),
                _ => unreachable_lanes(),
            }
        }
    }
}

/// `acc[idx[j]] += w · val[j]` over `entries` (one row; indices within a row are
/// distinct, so the read-modify-writes are independent).
///
/// # Safety
/// As [`row_score`], with `acc` in place of `qt` (writable).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_scatter<I: SparseIndex, L: Lanes>(
    acc: *mut f32,
    idx: &[I],
    vals: ValuePtr,
    entries: std::ops::Range<usize>,
    w: L,
) {
    // SAFETY: see the function contract; each read is within `entries`.
    unsafe {
        let mut j = entries.start;
        if same::<I, u8>() {
            let ip = idx.as_ptr().cast::<u8>();
            while j + 8 <= entries.end {
                let mut ix = ip.add(j).cast::<u64>().read_unaligned();
                for u in 0..8 {
                    let o = acc.add(L::W * (ix & 0xff) as usize);
                    L::fmadd(w, vals.splat::<L>(j + u), L::load(o)).store(o);
                    ix >>= 8;
                }
                j += 8;
            }
        }
        while j < entries.end {
            let o = acc.add(L::W * idx.get_unchecked(j).to_usize());
            L::fmadd(w, vals.splat::<L>(j), L::load(o)).store(o);
            j += 1;
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn softmax_update<const W: usize>(
    m: &mut [f32; W],
    l: &mut [f32; W],
    s: &mut [[f32; W]],
) -> [f32; W] {
    if W != 4 && W != 8 {
        return portable::softmax_update(m, l, s);
    }
    let flat = s.as_flattened_mut();
    let n8 = flat.len() & !7;
    // Lane k of an 8-wide vector holds q-head lane `k % W` (W divides 8).
    let mut mx = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in flat[..n8].chunks_exact(8) {
        // SAFETY: `c` holds 8 floats.
        mx = _mm256_max_ps(mx, unsafe { _mm256_loadu_ps(c.as_ptr()) });
    }
    let mut tile_max = [f32::NEG_INFINITY; W];
    for (k, v) in to_array(mx).iter().chain(&flat[n8..]).enumerate() {
        tile_max[k % W] = tile_max[k % W].max(*v);
    }
    let mut factor = [0.0f32; W];
    let mut m8 = [0.0f32; 8];
    for h in 0..W {
        let m_new = m[h].max(tile_max[h]);
        factor[h] = (m[h] - m_new).exp2();
        m[h] = m_new;
    }
    for (k, x) in m8.iter_mut().enumerate() {
        *x = m[k % W];
    }
    // SAFETY: `m8` holds 8 floats.
    let mv = unsafe { _mm256_loadu_ps(m8.as_ptr()) };
    let mut sum = _mm256_setzero_ps();
    for c in flat[..n8].chunks_exact_mut(8) {
        // SAFETY: `c` holds 8 floats.
        unsafe {
            let e = exp2(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            sum = _mm256_add_ps(sum, e);
        }
    }
    let mut sums = [0.0f32; W];
    for (k, v) in to_array(sum).iter().enumerate() {
        sums[k % W] += v;
    }
    for (k, x) in flat[n8..].iter_mut().enumerate() {
        *x = (*x - m[k % W]).exp2();
        sums[k % W] += *x;
    }
    for h in 0..W {
        l[h] = l[h] * factor[h] + sums[h];
    }
    factor
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn to_array(v: __m256) -> [f32; 8] {
    let mut a = [0.0f32; 8];
    // SAFETY: `a` holds 8 floats.
    unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
    a
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn decode<V: Value>(src: &[V], dst: &mut [f32]) {
    let n8 = src.len() & !7;
    for (s, d) in src[..n8].chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
        // SAFETY: `s` and `d` hold 8 elements each.
        unsafe { _mm256_storeu_ps(d.as_mut_ptr(), load8(s.as_ptr())) };
    }
    for (s, d) in src[n8..].iter().zip(&mut dst[n8..]) {
        *d = s.to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` when this CPU has AVX2/FMA/F16C; says so and skips otherwise.
    fn with_avx2(f: impl FnOnce()) {
        if crate::Isa::Avx2.is_available() {
            f();
        } else {
            eprintln!("SKIPPED: this CPU lacks AVX2/FMA/F16C");
        }
    }

    /// Decodes `src` through `load8` (8 at a time) and compares with `Value::to_f32`.
    fn decode_matches<D: Value>(src: &[D]) {
        let mut dst = vec![0.0f32; src.len()];
        // SAFETY: `with_avx2` checked the CPU features `decode` enables.
        unsafe { decode(src, &mut dst) };
        for (s, d) in src.iter().zip(&dst) {
            let want = s.to_f32();
            assert!(
                want.to_bits() == d.to_bits() || (want.is_nan() && d.is_nan()),
                "{s:?}: {d} != {want}"
            );
        }
    }

    #[test]
    fn every_fp8_code_decodes_like_the_table() {
        with_avx2(|| {
            let codes: Vec<Fp8E4M3> = (0..=255u8).map(Fp8E4M3::from_bits).collect();
            decode_matches(&codes);
            for (c, x) in codes.iter().zip(kv_sparse::fp8::DECODE_TABLE) {
                assert!(c.to_f32().to_bits() == x.to_bits() || x.is_nan());
            }
        });
    }

    #[test]
    fn every_f16_and_bf16_pattern_decodes_exactly() {
        with_avx2(|| {
            let f: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
            decode_matches(&f);
            let b: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
            decode_matches(&b);
        });
    }

    #[test]
    fn exp2_is_accurate_over_the_softmax_range() {
        with_avx2(|| {
            let xs: Vec<f32> = (0..=200_000).map(|i| -(i as f32) * 6.3e-4).collect();
            let mut worst = 0.0f64;
            for c in xs.chunks_exact(8) {
                let mut out = [0.0f32; 8];
                // SAFETY: `with_avx2` checked the features; `c` and `out` hold 8 floats.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp2(_mm256_loadu_ps(c.as_ptr()))) };
                for (x, y) in c.iter().zip(out) {
                    let want = f64::from(*x).exp2();
                    worst = worst.max((f64::from(y) - want).abs() / want);
                }
            }
            assert!(worst < 3e-7, "worst relative error {worst:e}");
            let mut out = [1.0f32; 8];
            let special = [-200.0, f32::NEG_INFINITY, -127.5, 0.0, -126.0, -0.5, -1.0, f32::NAN];
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), exp2(_mm256_loadu_ps(special.as_ptr()))) };
            assert_eq!(&out[..4], &[0.0, 0.0, 0.0, 1.0]);
            assert!((out[4] - 2f32.powi(-126)).abs() <= 2f32.powi(-126) * 1e-6);
            assert!(out[7].is_nan());
        });
    }
}
