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
//! per step and the value sum turned back once, as the paper's kernel does. The optional
//! 1-bit residual sketch (QJL) for unbiased inner products is not implemented.
//!
//! Bytes per row: `2 + ⌈d·bits/8⌉`. Lossless setting: none; a buffered cache whose buffer
//! holds every token never reaches these codes. Decoding is exact given the bytes
//! (`f32(norm)·codebook[code]`).

use std::sync::{Arc, Mutex};

use half::f16;

use crate::decoded::{DecodeRows, RowCodes, pack, packed_bytes, unpack};
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
            let norm = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt();
            let stored = f16::from_f64(norm);
            let n = stored.to_f32();
            for (c, &v) in self.codes.iter_mut().zip(x) {
                *c = nearest(&self.levels, if n > 0.0 { v / n } else { 0.0 });
            }
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
        let rb = 2 + packed_bytes(self.head_dim, self.bits);
        let row = &self.bytes[j * rb..(j + 1) * rb];
        let n = f16::from_le_bytes([row[0], row[1]]).to_f32();
        for (c, o) in out[..self.head_dim].iter_mut().enumerate() {
            *o = n * self.levels[usize::from(unpack(&row[2..], self.bits, c))];
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
