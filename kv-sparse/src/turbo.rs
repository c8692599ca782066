//! TurboQuant-style rows (Zandieh et al., arXiv 2504.19874, §3.1, the MSE-optimal stage): a
//! vector is split into its norm, stored in f16, and its direction, whose coordinates are
//! coded one by one with the Lloyd-Max codebook of **one coordinate of a uniformly random
//! unit vector in `d` dimensions** (density `∝ (1 − x²)^((d−3)/2)` on `[−1, 1]`) at 2, 3 or
//! 4 bits, codes packed LSB-first.
//!
//! The codebook is optimal only for directions spread evenly over the sphere; the paper
//! makes them so by a random rotation. Here the rotation is the cache's basis (a seeded
//! Haar-random or randomized Hadamard basis: queries and keys are turned once per step, the
//! value turn is absorbed into `W_V`/`W_O`), so attention reads codes in rotated
//! coordinates and the output is turned back by the absorbed `W_O` — the query rotated once
//! per step and the value sum turned back once, as the paper's kernel does.
//!
//! Bytes per row: `2 + ⌈d·bits/8⌉`. Lossless setting: none; a buffered cache whose buffer
//! holds every token never reaches these codes. Decoding is exact given the bytes
//! (`f32(norm)·codebook[code]`).
//!
//! [`TurboQjlRows`] is the paper's inner-product stage (§3.2, `Q_prod`) for keys: the
//! direction `u` is coded at `bits − 1` bits, and the residual `r = u − û` by its norm `γ`
//! (f16) and the signs of `S·r` (`d` bits, `S` a seeded `d × d` matrix of i.i.d. standard
//! normals, the QJL sketch). A key then reads back as `norm · (û + √(π/2)/d · γ · Sᵀ·sign)`,
//! whose inner product with any query is unbiased; the kernel forms it as
//! `norm · (q·û + √(π/2)/d · γ · (S·q)·sign)`, `S·q` once per step. Values keep the MSE codes
//! at `bits` bits (their sum, not their inner products, is what attention needs). Key bytes
//! per row: `4 + ⌈d·(bits − 1)/8⌉ + d/8`.

use std::sync::{Arc, Mutex};

use half::f16;

use crate::decoded::{DecodeRows, RowCodes, pack, packed_bytes};
use crate::memory::MemoryReport;
use crate::{Error, Result};

/// Largest element magnitude a row may hold: its norm (at most `√256 = 16` times that) must
/// fit an f16.
pub const OVERFLOW_AT: f32 = 65504.0 / 16.0;

/// Checks a TurboQuant-style layout: `bits` ∈ {2, 3, 4}, `head_dim` in `2..=256`, rows of
/// whole bytes.
///
/// # Errors
/// [`Error::InvalidCodeLayout`] naming the first violated rule.
pub fn check_layout(op: &'static str, bits: usize, head_dim: usize) -> Result<()> {
    let reason = if !(2..=4).contains(&bits) {
        Some(format!("bits = {bits}, expected 2, 3 or 4"))
    } else if !(2..=crate::MAX_HEAD_DIM).contains(&head_dim) {
        Some(format!("head_dim = {head_dim}, expected 2..={}", crate::MAX_HEAD_DIM))
    } else if !(head_dim * bits).is_multiple_of(8) {
        Some(format!("head_dim = {head_dim} at {bits} bits is not a whole number of bytes"))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidCodeLayout { op, format: "turbo", reason }),
        None => Ok(()),
    }
}

/// The Lloyd-Max levels (ascending) for one coordinate of a uniformly random unit vector in
/// `d` dimensions at `bits` bits, computed once per `(d, bits)` and shared.
///
/// # Examples
/// ```
/// let cb = kv_sparse::turbo::codebook(128, 2);
/// assert_eq!(cb.len(), 4);
/// // Symmetric, and near the Gaussian N(0, 1/d) optimum ±0.453/√d, ±1.510/√d.
/// assert!((cb[3] + cb[0]).abs() < 1e-6 && (cb[2] * 128f32.sqrt() - 0.453).abs() < 0.01);
/// assert!((cb[3] * 128f32.sqrt() - 1.510).abs() < 0.02);
/// ```
pub fn codebook(d: usize, bits: usize) -> Arc<[f32]> {
    /// Codebooks made so far, by `(d, bits)`.
    type Made = Vec<((usize, usize), Arc<[f32]>)>;
    static CACHE: Mutex<Made> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, cb)) = cache.iter().find(|(k, _)| *k == (d, bits)) {
        return Arc::clone(cb);
    }
    let cb: Arc<[f32]> = lloyd_max(d, bits).into_iter().map(|x| x as f32).collect();
    cache.push(((d, bits), Arc::clone(&cb)));
    cb
}

/// Lloyd-Max iteration on a fine grid of the coordinate density.
fn lloyd_max(d: usize, bits: usize) -> Vec<f64> {
    const GRID: usize = 1 << 14;
    let exponent = (d as f64 - 3.0) / 2.0;
    let xs: Vec<f64> = (0..GRID).map(|i| -1.0 + (2 * i + 1) as f64 / GRID as f64).collect();
    let ws: Vec<f64> = xs.iter().map(|x| (1.0 - x * x).max(0.0).powf(exponent)).collect();
    let n = 1usize << bits;
    // Start from the Gaussian scale: levels spread over ±2.5σ, σ = 1/√d.
    let sigma = 1.0 / (d as f64).sqrt();
    let mut levels: Vec<f64> =
        (0..n).map(|k| sigma * (-2.5 + 5.0 * (k as f64 + 0.5) / n as f64)).collect();
    for _ in 0..300 {
        let bounds: Vec<f64> = levels.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
        let (mut sum, mut mass) = (vec![0.0; n], vec![0.0; n]);
        let mut cell = 0;
        for (&x, &w) in xs.iter().zip(&ws) {
            while cell < n - 1 && x > bounds[cell] {
                cell += 1;
            }
            sum[cell] += w * x;
            mass[cell] += w;
        }
        for k in 0..n {
            if mass[k] > 0.0 {
                levels[k] = sum[k] / mass[k];
            }
        }
    }
    // Exact symmetry (the density is even).
    for k in 0..n / 2 {
        let m = (levels[n - 1 - k] - levels[k]) / 2.0;
        (levels[k], levels[n - 1 - k]) = (-m, m);
    }
    levels
}

/// The code of `u` (a unit vector's coordinate): the nearest level.
#[inline]
fn nearest(levels: &[f32], u: f32) -> u8 {
    let mut best = 0;
    for (k, w) in levels.windows(2).enumerate() {
        if u > (w[0] + w[1]) / 2.0 {
            best = k + 1;
        }
    }
    best as u8
}

/// Codes `x`'s direction (`x / ‖x‖` with the norm as stored in f16) into `codes` with the
/// nearest of `levels`, the residual `u − levels[code]` into `residual` when given; returns
/// the stored norm.
fn code_direction(
    x: &[f32],
    levels: &[f32],
    codes: &mut [u8],
    residual: Option<&mut [f32]>,
) -> f16 {
    let norm = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
    let stored = f16::from_f64(norm);
    let n = stored.to_f32();
    let unit = |v: f32| if n > 0.0 { v / n } else { 0.0 };
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = nearest(levels, unit(v));
    }
    if let Some(r) = residual {
        for ((r, &c), &v) in r.iter_mut().zip(codes.iter()).zip(x) {
            *r = unit(v) - levels[usize::from(c)];
        }
    }
    stored
}

/// Codes one row into `out` as a [`TurboRows`] row — `[f16 norm][packed codes]`, `2 +
/// ⌈d·bits/8⌉` bytes — with the codebook `levels` of `(x.len(), bits)` ([`codebook`]): the
/// per-row form for stores that place rows themselves (a tiered store's pages).
///
/// # Errors
/// [`Error::LengthMismatch`] for an `out` that is not one row or `levels` that are not
/// `2^bits`; as [`check_layout`]; [`Error::NonFinite`] / [`Error::ScaleOverflow`] for a row
/// whose norm an f16 cannot hold.
pub fn encode_row(bits: usize, levels: &[f32], x: &[f32], out: &mut [u8]) -> Result<()> {
    const OP: &str = "turbo::encode_row";
    let d = x.len();
    check_layout(OP, bits, d)?;
    for (what, expected, got) in
        [("levels", 1 << bits, levels.len()), ("out", 2 + packed_bytes(d, bits), out.len())]
    {
        if expected != got {
            return Err(Error::LengthMismatch { op: OP, what, expected, got });
        }
    }
    crate::value::check_rows(OP, d, x, (OVERFLOW_AT, || format!("turbo{bits}")))?;
    crate::decoded::with_scratch(d, |codes: &mut [u8]| {
        let stored = code_direction(x, levels, codes, None);
        out[..2].copy_from_slice(&stored.to_le_bytes());
        pack(codes, bits, &mut out[2..]);
    });
    Ok(())
}

/// TurboQuant-style rows at `BITS` bits (2, 3 or 4): `[f16 norm][packed codes]` each.
#[derive(Clone, Debug)]
pub struct TurboRows<const BITS: usize> {
    head_dim: usize,
    levels: Arc<[f32]>,
    bytes: Vec<u8>,
    codes: Vec<u8>,
}

impl<const BITS: usize> TurboRows<BITS> {
    /// No rows, for vectors of `head_dim` elements.
    ///
    /// # Errors
    /// As [`check_layout`].
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::decoded::DecodeRows;
    /// use kv_sparse::turbo::TurboRows;
    /// let mut rows = TurboRows::<3>::new(64)?;
    /// let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 19) as f32 - 9.0).collect();
    /// rows.push(&x)?;
    /// assert_eq!(rows.memory().held_bytes(), 2 + 24); // f16 norm + 64 codes of 3 bits
    /// let mut back = vec![0.0; 64];
    /// rows.view().decode_row(0, &mut back);
    /// let err: f32 = x.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum();
    /// let norm: f32 = x.iter().map(|a| a * a).sum();
    /// assert!(err / norm < 0.06); // 3 bits: ≈ 0.03 relative MSE for spread directions
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(head_dim: usize) -> Result<Self> {
        check_layout("TurboRows::new", BITS, head_dim)?;
        Ok(Self {
            head_dim,
            levels: codebook(head_dim, BITS),
            bytes: Vec::new(),
            codes: vec![0; head_dim],
        })
    }

    /// Bytes of one row.
    pub const fn row_bytes(head_dim: usize) -> usize {
        2 + packed_bytes(head_dim, BITS)
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.bytes.len() / Self::row_bytes(self.head_dim)
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Checks rows (flattened) without storing them.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::NonFinite`], [`Error::ScaleOverflow`].
    pub fn check(&self, op: &'static str, rows: &[f32]) -> Result<()> {
        let limit = (OVERFLOW_AT, || format!("turbo{BITS}"));
        crate::value::check_rows(op, self.head_dim, rows, limit)
    }

    /// Appends whole rows. All-or-nothing.
    ///
    /// # Errors
    /// As [`TurboRows::check`].
    pub fn push(&mut self, rows: &[f32]) -> Result<()> {
        self.check("TurboRows::push", rows)?;
        let rb = Self::row_bytes(self.head_dim);
        for x in rows.chunks_exact(self.head_dim) {
            let stored = code_direction(x, &self.levels, &mut self.codes, None);
            let start = self.bytes.len();
            self.bytes.resize(start + rb, 0);
            self.bytes[start..start + 2].copy_from_slice(&stored.to_le_bytes());
            pack(&self.codes, BITS, &mut self.bytes[start + 2..start + rb]);
        }
        Ok(())
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        self.bytes.truncate(rows * Self::row_bytes(self.head_dim));
    }

    /// Reserves room for `rows` more rows.
    pub fn reserve(&mut self, rows: usize) {
        self.bytes.reserve(rows * Self::row_bytes(self.head_dim));
    }

    /// Bytes held: codes as `dense_bytes`, norms as `scale_bytes`.
    pub fn memory(&self) -> MemoryReport {
        let norms = 2 * self.len();
        MemoryReport {
            dense_bytes: self.bytes.len() - norms,
            scale_bytes: norms,
            capacity_slack_bytes: self.bytes.capacity() - self.bytes.len() + self.codes.capacity(),
            ..MemoryReport::default()
        }
    }

    /// The rows' bytes, as held (`[f16 norm][packed codes]` each).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Rows from their bytes (as [`TurboRows::bytes`] gives them), checked as untrusted
    /// input: whole rows, every norm a finite non-negative f16.
    ///
    /// # Errors
    /// As [`check_layout`]; [`Error::Corrupt`] for a partial row or a bad norm.
    pub fn from_bytes(head_dim: usize, bytes: &[u8]) -> Result<Self> {
        let mut rows = Self::new(head_dim)?;
        let rb = Self::row_bytes(head_dim);
        if !bytes.len().is_multiple_of(rb) {
            let reason = format!("{} bytes are not whole turbo{BITS} rows of {rb}", bytes.len());
            return Err(Error::Corrupt { reason });
        }
        for (j, row) in bytes.chunks_exact(rb).enumerate() {
            let norm = f16::from_le_bytes([row[0], row[1]]);
            if !norm.is_finite() || norm.is_sign_negative() && norm.to_f32() != 0.0 {
                return Err(Error::Corrupt { reason: format!("row {j}: norm {norm}") });
            }
        }
        rows.bytes = bytes.to_vec();
        Ok(rows)
    }

    /// Borrowed view of every row (what kernels read).
    pub fn view(&self) -> TurboView<'_> {
        TurboView { bits: BITS, head_dim: self.head_dim, levels: &self.levels, bytes: &self.bytes }
    }
}

/// Borrowed TurboQuant-style rows.
#[derive(Clone, Copy, Debug)]
pub struct TurboView<'a> {
    bits: usize,
    head_dim: usize,
    levels: &'a [f32],
    bytes: &'a [u8],
}

impl TurboView<'_> {
    /// The codebook's levels, ascending.
    pub fn levels(&self) -> &[f32] {
        self.levels
    }
}

impl DecodeRows for TurboView<'_> {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn num_rows(&self) -> usize {
        self.bytes.len() / (2 + packed_bytes(self.head_dim, self.bits))
    }

    fn decode_row(&self, j: usize, out: &mut [f32]) {
        if let Some(codes) = self.codes() {
            codes.decode_row(j, &mut out[..self.head_dim]);
        }
    }

    fn codes(&self) -> Option<RowCodes<'_>> {
        Some(RowCodes::Codebook { bits: self.bits, levels: self.levels, bytes: self.bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relative MSE of random directions near the paper's figures for a spread vector
    /// (≈ 0.117, 0.03, 0.009 at 2, 3, 4 bits); zero rows stay zero; bad input is typed.
    fn mse<const B: usize>() -> f64 {
        let d = 128;
        let mut rows = TurboRows::<B>::new(d).unwrap();
        let mut state = 12345u64;
        let mut gauss = || {
            // Box–Muller from a small LCG: reproducible Gaussian coordinates.
            let mut u = || {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
            };
            let (a, b) = (u(), u());
            ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
        };
        let x: Vec<f32> = (0..200 * d).map(|_| gauss()).collect();
        rows.push(&x).unwrap();
        let (mut err, mut norm) = (0.0, 0.0);
        let mut out = vec![0.0; d];
        for j in 0..200 {
            rows.view().decode_row(j, &mut out);
            for c in 0..d {
                err += f64::from(out[c] - x[j * d + c]).powi(2);
                norm += f64::from(x[j * d + c]).powi(2);
            }
        }
        err / norm
    }

    #[test]
    fn distortion_matches_the_lloyd_max_figures() {
        let (m2, m3, m4) = (mse::<2>(), mse::<3>(), mse::<4>());
        assert!((0.10..0.13).contains(&m2), "2 bits: {m2}");
        assert!((0.025..0.04).contains(&m3), "3 bits: {m3}");
        assert!((0.007..0.012).contains(&m4), "4 bits: {m4}");
    }

    /// The QJL-keyed rows' inner products are unbiased over the sketch: with keys leaning
    /// towards `q` (so that shrinkage shows), the mean error of `q·k̃` over 32 sketch draws
    /// (200 keys each) is within 4 standard errors of 0 and a small fraction of the bias of
    /// the 1-bit codes the sketched keys spend on codes; the stored bytes follow the formula.
    #[test]
    fn sketched_keys_give_unbiased_inner_products() {
        use crate::decoded::Side;
        let (d, n) = (64, 200);
        let mut state = 99u64;
        let mut gauss = || {
            let mut u = || {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
            };
            let (a, b) = (u(), u());
            ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
        };
        let q: Vec<f32> = (0..d).map(|_| gauss()).collect();
        let x: Vec<f32> = (0..n * d).map(|i| gauss() + 0.5 * q[i % d]).collect();
        let dot =
            |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum::<f64>();
        let mut out = vec![0.0; d];
        let per_draw: Vec<f64> = (0..32)
            .map(|seed| {
                let mut keys = TurboQjlRows::<2>::new(Side::Keys, d).unwrap();
                keys.sketch = seeded_sketch(d, seed + 1);
                keys.push(&x).unwrap();
                let total: f64 = (0..n)
                    .map(|j| {
                        keys.view().decode_row(j, &mut out);
                        dot(&q, &out) - dot(&q, &x[j * d..(j + 1) * d])
                    })
                    .sum();
                total / n as f64
            })
            .collect();
        let k = per_draw.len() as f64;
        let mean = per_draw.iter().sum::<f64>() / k;
        let var = per_draw.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (k - 1.0);
        let se = (var / k).sqrt();
        assert!(mean.abs() < 4.0 * se, "QJL keys: mean error {mean} ± {se}");
        // The 1-bit codes alone shrink every inner product.
        let levels = codebook(d, 1);
        let bias = (0..n)
            .map(|j| {
                let row = &x[j * d..(j + 1) * d];
                let norm = row.iter().map(|v| f64::from(v * v)).sum::<f64>().sqrt() as f32;
                let coded: Vec<f32> = row
                    .iter()
                    .map(|&v| norm * levels[usize::from(nearest(&levels, v / norm))])
                    .collect();
                dot(&q, &coded) - dot(&q, row)
            })
            .sum::<f64>()
            / n as f64;
        assert!(
            bias < -10.0 * se && mean.abs() < 0.2 * bias.abs(),
            "1-bit codes: {bias}, QJL {mean}"
        );
        let mut values = TurboQjlRows::<2>::new(Side::Values, d).unwrap();
        values.push(&x[..d]).unwrap();
        assert_eq!(values.memory().held_bytes(), 2 + 16);
        let mut keys = TurboQjlRows::<2>::new(Side::Keys, d).unwrap();
        keys.push(&x).unwrap();
        assert_eq!(keys.memory().held_bytes(), n * (4 + 8 + 8));
    }

    #[test]
    fn zero_rows_and_bad_input() {
        let mut rows = TurboRows::<2>::new(32).unwrap();
        rows.push(&[0.0; 32]).unwrap();
        let mut out = [1.0; 32];
        rows.view().decode_row(0, &mut out);
        assert_eq!(out, [0.0; 32]);
        assert!(matches!(TurboRows::<5>::new(32), Err(Error::InvalidCodeLayout { .. })));
        assert!(TurboRows::<3>::new(12).is_err()); // 36 bits a row
        assert!(matches!(rows.push(&[f32::INFINITY; 32]), Err(Error::NonFinite { .. })));
        assert!(matches!(rows.push(&[5000.0; 32]), Err(Error::ScaleOverflow { .. })));
        assert_eq!(rows.len(), 1);
    }
}

/// The QJL sketch matrix for `d` dimensions: `d × d` i.i.d. standard normals, row-major,
/// from a fixed seed (the same for every store of that width), made once and shared.
pub fn sketch(d: usize) -> Arc<[f32]> {
    type Made = Vec<(usize, Arc<[f32]>)>;
    static CACHE: Mutex<Made> = Mutex::new(Vec::new());
    let mut cache = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, s)) = cache.iter().find(|(k, _)| *k == d) {
        return Arc::clone(s);
    }
    let m = seeded_sketch(d, 0);
    cache.push((d, Arc::clone(&m)));
    m
}

/// A `d × d` matrix of i.i.d. standard normals from `seed`.
fn seeded_sketch(d: usize, seed: u64) -> Arc<[f32]> {
    // SplitMix64 and Box–Muller: reproducible on every platform.
    let mut state = 0x5157_4A4C_0000_0000u64 ^ d as u64 ^ seed.rotate_left(32);
    let mut uniform = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..d * d)
        .map(|_| {
            let (a, b) = (uniform(), uniform());
            ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()) as f32
        })
        .collect()
}

/// Checks a layout of TurboQuant's inner-product keys ([`TurboQjlRows`]): as
/// [`check_layout`], and a `head_dim` that is a multiple of 8 (the signs fill whole bytes).
///
/// # Errors
/// [`Error::InvalidCodeLayout`] naming the first violated rule.
pub fn check_qjl_layout(op: &'static str, bits: usize, head_dim: usize) -> Result<()> {
    check_layout(op, bits, head_dim)?;
    if !head_dim.is_multiple_of(8) {
        let reason = format!("head_dim = {head_dim} is not a multiple of 8 (sign bits)");
        return Err(Error::InvalidCodeLayout { op, format: "turbo qjl", reason });
    }
    Ok(())
}

/// `√(π/2) / d`: the QJL sketch's scale.
pub fn sketch_scale(d: usize) -> f32 {
    ((std::f64::consts::PI / 2.0).sqrt() / d as f64) as f32
}

/// Codes one key row into `out` as a [`TurboQjlRows`] key row at `bits` bits in all —
/// `[f16 norm][f16 γ][codes at bits − 1][d sign bits]` — with `levels` =
/// `codebook(d, bits − 1)` and `sketch` = [`sketch`]`(d)`: the per-row form for stores that
/// place rows themselves.
///
/// # Errors
/// As [`check_qjl_layout`]; [`Error::LengthMismatch`] for `levels`, `sketch` or `out` of
/// another size; [`Error::NonFinite`] / [`Error::ScaleOverflow`] for a row an f16 norm
/// cannot hold.
pub fn encode_qjl_key_row(
    bits: usize,
    (levels, sketch): (&[f32], &[f32]),
    x: &[f32],
    out: &mut [u8],
) -> Result<()> {
    const OP: &str = "turbo::encode_qjl_key_row";
    let d = x.len();
    check_qjl_layout(OP, bits, d)?;
    let want = [
        ("levels", 1 << (bits - 1), levels.len()),
        ("sketch", d * d, sketch.len()),
        ("out", 4 + packed_bytes(d, bits - 1) + d / 8, out.len()),
    ];
    if let Some(&(what, expected, got)) = want.iter().find(|(_, e, g)| e != g) {
        return Err(Error::LengthMismatch { op: OP, what, expected, got });
    }
    crate::value::check_rows(OP, d, x, (OVERFLOW_AT, || format!("turbo{bits} qjl")))?;
    out.fill(0);
    crate::decoded::with_scratch(d, |codes: &mut [u8]| {
        crate::decoded::with_scratch(d, |residual: &mut [f32]| {
            code_qjl_key(bits - 1, (levels, sketch), x, (codes, residual), out);
        });
    });
    Ok(())
}

/// Writes the QJL key row of `x` (codes at `code_bits`) into the zeroed `row`; `codes` and
/// `residual` are `d`-long scratch.
fn code_qjl_key(
    code_bits: usize,
    (levels, sketch): (&[f32], &[f32]),
    x: &[f32],
    (codes, residual): (&mut [u8], &mut [f32]),
    row: &mut [u8],
) {
    let d = x.len();
    let stored = code_direction(x, levels, codes, Some(residual));
    row[..2].copy_from_slice(&stored.to_le_bytes());
    let gamma = residual.iter().map(|&r| f64::from(r).powi(2)).sum::<f64>().sqrt();
    row[2..4].copy_from_slice(&f16::from_f64(gamma).to_le_bytes());
    let cb = packed_bytes(d, code_bits);
    pack(codes, code_bits, &mut row[4..4 + cb]);
    let signs = &mut row[4 + cb..];
    for (i, s_row) in sketch.chunks_exact(d).enumerate() {
        let proj: f32 = s_row.iter().zip(residual.iter()).map(|(a, b)| a * b).sum();
        if proj >= 0.0 {
            signs[i / 8] |= 1 << (i % 8);
        }
    }
}

/// TurboQuant's inner-product rows at `BITS` bits (2, 3 or 4) for keys — the direction's
/// codes at `BITS − 1` bits plus the QJL sign sketch of the residual — and the MSE rows at
/// `BITS` bits for values (the side is chosen when the store is made). See the module docs.
#[derive(Clone, Debug)]
pub struct TurboQjlRows<const BITS: usize> {
    side: crate::decoded::Side,
    head_dim: usize,
    /// Key rows: `[f16 norm][f16 γ][codes at BITS − 1][d sign bits]`; value rows as
    /// [`TurboRows`].
    bytes: Vec<u8>,
    levels: Arc<[f32]>,
    sketch: Arc<[f32]>,
    codes: Vec<u8>,
    scratch: Vec<f32>,
}

impl<const BITS: usize> TurboQjlRows<BITS> {
    /// No rows of one side, for vectors of `head_dim` elements (a multiple of 8).
    ///
    /// # Errors
    /// As [`check_qjl_layout`].
    ///
    /// # Examples
    /// ```
    /// use kv_sparse::decoded::{DecodeRows, Side};
    /// use kv_sparse::turbo::TurboQjlRows;
    /// let mut keys = TurboQjlRows::<3>::new(Side::Keys, 64)?;
    /// let x: Vec<f32> = (0..64).map(|i| ((i * 37) % 19) as f32 - 9.0).collect();
    /// keys.push(&x)?;
    /// // norm, γ, 64 codes of 2 bits, 64 sign bits.
    /// assert_eq!(keys.memory().held_bytes(), 4 + 16 + 8);
    /// let mut back = vec![0.0; 64];
    /// keys.view().decode_row(0, &mut back);
    /// let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    /// let q: Vec<f32> = (0..64).map(|i| (i % 5) as f32 - 2.0).collect();
    /// assert!((dot(&q, &back) - dot(&q, &x)).abs() < 0.2 * dot(&x, &x).sqrt() * dot(&q, &q).sqrt());
    /// # Ok::<(), kv_sparse::Error>(())
    /// ```
    pub fn new(side: crate::decoded::Side, head_dim: usize) -> Result<Self> {
        check_qjl_layout("TurboQjlRows::new", BITS, head_dim)?;
        let keys = side == crate::decoded::Side::Keys;
        let (levels, sketch) = if keys {
            (codebook(head_dim, BITS - 1), sketch(head_dim))
        } else {
            (codebook(head_dim, BITS), Arc::from(Vec::new()))
        };
        Ok(Self {
            side,
            head_dim,
            bytes: Vec::new(),
            levels,
            sketch,
            codes: vec![0; head_dim],
            scratch: vec![0.0; head_dim],
        })
    }

    /// Bytes of one row of `side`.
    pub const fn row_bytes(side: crate::decoded::Side, head_dim: usize) -> usize {
        match side {
            crate::decoded::Side::Keys => 4 + packed_bytes(head_dim, BITS - 1) + head_dim / 8,
            crate::decoded::Side::Values => TurboRows::<BITS>::row_bytes(head_dim),
        }
    }

    fn rb(&self) -> usize {
        Self::row_bytes(self.side, self.head_dim)
    }

    /// Which side this store holds.
    pub fn side(&self) -> crate::decoded::Side {
        self.side
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.rb()
    }

    /// True when no row is held.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Elements per row.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Checks rows (flattened) without storing them.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::NonFinite`], [`Error::ScaleOverflow`].
    pub fn check(&self, op: &'static str, rows: &[f32]) -> Result<()> {
        let limit = (OVERFLOW_AT, || format!("turbo{BITS} qjl"));
        crate::value::check_rows(op, self.head_dim, rows, limit)
    }

    /// Appends whole rows. All-or-nothing.
    ///
    /// # Errors
    /// As [`TurboQjlRows::check`].
    pub fn push(&mut self, rows: &[f32]) -> Result<()> {
        self.check("TurboQjlRows::push", rows)?;
        let (d, rb) = (self.head_dim, self.rb());
        let keys = self.side == crate::decoded::Side::Keys;
        let bits = if keys { BITS - 1 } else { BITS };
        for x in rows.chunks_exact(d) {
            let start = self.bytes.len();
            self.bytes.resize(start + rb, 0);
            let row = &mut self.bytes[start..start + rb];
            if !keys {
                let stored = code_direction(x, &self.levels, &mut self.codes, None);
                row[..2].copy_from_slice(&stored.to_le_bytes());
                pack(&self.codes, bits, &mut row[2..]);
                continue;
            }
            let (codes, residual) = (&mut self.codes, &mut self.scratch);
            code_qjl_key(bits, (&self.levels, &self.sketch), x, (codes, residual), row);
        }
        Ok(())
    }

    /// Keeps the first `rows` rows.
    pub fn truncate(&mut self, rows: usize) {
        let rb = self.rb();
        self.bytes.truncate(rows * rb);
    }

    /// Reserves room for `rows` more rows.
    pub fn reserve(&mut self, rows: usize) {
        let rb = self.rb();
        self.bytes.reserve(rows * rb);
    }

    /// Bytes held: codes and signs as `dense_bytes`, norms (and `γ`) as `scale_bytes`.
    pub fn memory(&self) -> MemoryReport {
        let per_row = if self.side == crate::decoded::Side::Keys { 4 } else { 2 };
        let scales = per_row * self.len();
        MemoryReport {
            dense_bytes: self.bytes.len() - scales,
            scale_bytes: scales,
            capacity_slack_bytes: self.bytes.capacity() - self.bytes.len()
                + self.codes.capacity()
                + 4 * self.scratch.capacity(),
            ..MemoryReport::default()
        }
    }

    /// The rows' bytes, as held.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Rows of `side` from their bytes, checked as untrusted input: whole rows, every norm
    /// and `γ` a finite non-negative f16.
    ///
    /// # Errors
    /// As [`TurboQjlRows::new`]; [`Error::Corrupt`] for a partial row or a bad norm.
    pub fn from_bytes(side: crate::decoded::Side, head_dim: usize, bytes: &[u8]) -> Result<Self> {
        let mut rows = Self::new(side, head_dim)?;
        let rb = rows.rb();
        if !bytes.len().is_multiple_of(rb) {
            let reason =
                format!("{} bytes are not whole turbo{BITS} qjl rows of {rb}", bytes.len());
            return Err(Error::Corrupt { reason });
        }
        let scales = if side == crate::decoded::Side::Keys { 2 } else { 1 };
        for (j, row) in bytes.chunks_exact(rb).enumerate() {
            for b in row[..2 * scales].chunks_exact(2) {
                let x = f16::from_le_bytes([b[0], b[1]]);
                if !x.is_finite() || x.to_f32() < 0.0 {
                    return Err(Error::Corrupt { reason: format!("row {j}: norm {x}") });
                }
            }
        }
        rows.bytes = bytes.to_vec();
        Ok(rows)
    }

    /// Borrowed view of every row (what kernels read).
    pub fn view(&self) -> TurboQjlView<'_> {
        TurboQjlView {
            side: self.side,
            bits: BITS,
            head_dim: self.head_dim,
            levels: &self.levels,
            sketch: &self.sketch,
            bytes: &self.bytes,
        }
    }
}

/// Borrowed rows of a [`TurboQjlRows`] side.
#[derive(Clone, Copy, Debug)]
pub struct TurboQjlView<'a> {
    side: crate::decoded::Side,
    bits: usize,
    head_dim: usize,
    levels: &'a [f32],
    sketch: &'a [f32],
    bytes: &'a [u8],
}

impl DecodeRows for TurboQjlView<'_> {
    fn head_dim(&self) -> usize {
        self.head_dim
    }

    fn num_rows(&self) -> usize {
        let rb = match self.side {
            crate::decoded::Side::Keys => {
                4 + packed_bytes(self.head_dim, self.bits - 1) + self.head_dim / 8
            }
            crate::decoded::Side::Values => 2 + packed_bytes(self.head_dim, self.bits),
        };
        self.bytes.len() / rb
    }

    /// Keys: `norm · (û + √(π/2)/d · γ · Sᵀ·sign)` (the unbiased read-back); values:
    /// `norm · levels[code]`.
    fn decode_row(&self, j: usize, out: &mut [f32]) {
        if let Some(codes) = self.codes() {
            codes.decode_row(j, &mut out[..self.head_dim]);
        }
    }

    fn codes(&self) -> Option<RowCodes<'_>> {
        Some(match self.side {
            crate::decoded::Side::Keys => RowCodes::CodebookSketch {
                bits: self.bits - 1,
                levels: self.levels,
                sketch: self.sketch,
                bytes: self.bytes,
            },
            crate::decoded::Side::Values => {
                RowCodes::Codebook { bits: self.bits, levels: self.levels, bytes: self.bytes }
            }
        })
    }
}
