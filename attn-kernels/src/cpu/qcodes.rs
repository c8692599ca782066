//! Queries rounded to 8-bit codes for integer score products over int8 and 4-bit keys —
//! the `q8_0 × q8_0` and `q4_0 × q8_0` dot products llama.cpp runs on 8- and 4-bit KV
//! caches — an opt-in, lossy alternative to the exact f32 products of SWAN's scores `q̂·k_j`
//! (method section) over dense `q8_0` / `q4_0` rows and int8-valued sparse rows.
//!
//! Per work item and q-head `h`, the scaled query becomes `q_h ≈ σ_h · c_h` with
//! `σ_h = max|q_h| / 127` and `c_h = round(q_h / σ_h)` in `−127..=127`. A key row `k`
//! (codes `κ`, scales as its format says) then scores `σ_h · Σ_i c_{h,i} · κ_i · s(i)`,
//! the inner sums in exact 32-bit integers. AVX-512 VNNI multiplies an unsigned byte by a
//! signed one, so those kernels flip each key code's sign bit (`κ + 128`) and start every
//! 32-bit lane at `−128 ·` (its four query codes' sum), which cancels the offset exactly;
//! AVX2's kernels multiply `|κ|` by the query codes carrying `κ`'s signs
//! ([`super::avx2_int`]). The only error is the query's rounding: at most `σ_h / 2` per
//! component, so a score moves by at most `σ_h / 2 · Σ_i |k_i|`.

use std::ops::Range;

use super::codes::{CodeKind, CodeRow, Codes, MASKED_MAX_DIM, MaskedRow};
use super::tile::{DENSE_PASS, Kernels};

/// Components per integer product (one 512-bit register of codes).
pub(crate) const CHUNK: usize = 64;
/// 32-bit lanes per product.
const LANES: usize = 16;

/// The queries of one work item as 8-bit codes (see the [module docs](self)).
#[derive(Debug, Default)]
pub(crate) struct QueryCodes {
    d: usize,
    /// `heads × d` codes, head-major.
    codes: Vec<i8>,
    /// `σ_h` per head.
    scales: Vec<f32>,
    /// Per head and chunk of [`CHUNK`] components, 16 lanes of `−128 ·` the sum of the
    /// lane's four codes (`heads × d/64 × 16`).
    bias: Vec<i32>,
    /// Per head, the 16 lanes' biases summed over the chunks (`heads × 16`).
    total: Vec<i32>,
}

/// The codes of a run of heads of a [`QueryCodes`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct QueryView<'a> {
    /// Components per head (a multiple of [`CHUNK`]).
    pub d: usize,
    /// `heads × d` codes.
    pub codes: &'a [i8],
    /// `σ_h` per head.
    pub scales: &'a [f32],
    /// `heads × d/64 × 16` lane biases.
    pub bias: &'a [i32],
    /// `heads × 16` summed lane biases.
    pub total: &'a [i32],
}

impl QueryView<'_> {
    /// Heads in the view.
    pub fn heads(&self) -> usize {
        self.scales.len()
    }
}

impl QueryCodes {
    /// Grows the buffers for `heads` heads of `d` components (a multiple of [`CHUNK`]).
    pub fn reserve(&mut self, heads: usize, d: usize) {
        let chunks = d / CHUNK;
        self.codes.reserve((heads * d).saturating_sub(self.codes.len()));
        self.scales.reserve(heads.saturating_sub(self.scales.len()));
        self.bias.reserve((heads * chunks * LANES).saturating_sub(self.bias.len()));
        self.total.reserve((heads * LANES).saturating_sub(self.total.len()));
    }

    /// Rounds the head-major queries `q` (`heads × d`, finite, `d` a multiple of
    /// [`CHUNK`]) to codes.
    pub fn quantize(&mut self, q: &[f32], d: usize) {
        assert!(d > 0 && d.is_multiple_of(CHUNK) && q.len().is_multiple_of(d));
        let heads = q.len() / d;
        self.d = d;
        self.codes.clear();
        self.scales.clear();
        self.bias.clear();
        self.total.clear();
        for qh in q.chunks_exact(d) {
            let max = qh.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let scale = max / 127.0;
            let inv = if max > 0.0 { 127.0 / max } else { 0.0 };
            self.scales.push(scale);
            // |x · inv| ≤ 127 up to rounding; the clamp keeps a rounded 127.00002 in range.
            self.codes.extend(qh.iter().map(|x| (x * inv).round().clamp(-127.0, 127.0) as i8));
        }
        for h in 0..heads {
            let mut total = [0i32; LANES];
            for chunk in self.codes[h * d..(h + 1) * d].chunks_exact(CHUNK) {
                for (lane, four) in chunk.chunks_exact(4).enumerate() {
                    let b = -128 * four.iter().map(|&c| i32::from(c)).sum::<i32>();
                    self.bias.push(b);
                    total[lane] += b;
                }
            }
            self.total.extend(total);
        }
    }

    /// Heads `heads` of the last [`QueryCodes::quantize`].
    pub fn view(&self, heads: Range<usize>) -> QueryView<'_> {
        let (d, chunks) = (self.d, self.d / CHUNK);
        QueryView {
            d,
            codes: &self.codes[heads.start * d..heads.end * d],
            scales: &self.scales[heads.clone()],
            bias: &self.bias[heads.start * chunks * LANES..heads.end * chunks * LANES],
            total: &self.total[heads.start * LANES..heads.end * LANES],
        }
    }
}

impl Kernels {
    /// Whether the keys of format `C` with `d` components score by integer products with
    /// int8 queries: the kernels were made with int8 queries
    /// ([`Kernels::with_int8_queries`]), the keys are int8 or 4-bit codes (`q8_0` or `q4_0`
    /// blocks, or per-component int8 codes with a row scale) and `d` is a multiple of
    /// [`CHUNK`] up to [`MASKED_MAX_DIM`].
    pub fn int8_scores<C: Codes>(self, d: usize) -> bool {
        self.int8_queries()
            && matches!(C::KIND, CodeKind::I8 | CodeKind::Q8Blocks | CodeKind::Q4Blocks)
            && d > 0
            && d.is_multiple_of(CHUNK)
            && d <= MASKED_MAX_DIM
    }

    /// [`Kernels::code_scores`] with the query codes `q` (≤ [`DENSE_PASS`] heads):
    /// `s[t][lane0 + h] = σ_h · Σ_i c_{h,i} · value_i(rows[t])`. Only where
    /// [`Kernels::int8_scores`] holds for `C` and `q.d`.
    pub fn code_scores_i8<C: Codes, const W: usize>(
        self,
        q: QueryView<'_>,
        rows: &[CodeRow<'_>],
        lane0: usize,
        s: &mut [[f32; W]],
    ) {
        let heads = q.heads();
        assert!(self.int8_scores::<C>(q.d), "no integer products for these keys");
        assert!((1..=DENSE_PASS).contains(&heads) && lane0 + heads <= W && s.len() >= rows.len());
        assert!(rows.iter().all(|r| r.bytes.len() >= C::row_bytes(q.d)), "a short coded row");
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self {
            if t.vnni() && C::KIND != CodeKind::Q4Blocks {
                // SAFETY: a token with `vnni` exists only after `Isa::Avx512.is_available()`
                // and the AVX-512 VNNI and VL checks returned true.
                return unsafe { super::avx512_int::code_scores::<C, W>(q, rows, lane0, s) };
            }
            // SAFETY: an `Avx2Token` exists only after `Isa::Avx2.is_available()` returned
            // true, so the CPU supports AVX2, FMA and F16C.
            return unsafe { super::avx2_int::code_scores::<C, W>(q, rows, lane0, s) };
        }
        unreachable!("int8 queries run on the AVX2 and AVX-512 kernels only");
    }

    /// [`Kernels::masked_scores`] with the query codes `q`, as
    /// [`Kernels::code_scores_i8`]. Only where [`Kernels::int8_scores`] holds for `C` and
    /// `q.d`, and [`Kernels::fuses_masked`] for `C` and `q.d`.
    pub fn masked_scores_i8<C: Codes, const W: usize>(
        self,
        q: QueryView<'_>,
        rows: &[MaskedRow<'_>],
        lane0: usize,
        s: &mut [[f32; W]],
    ) {
        let heads = q.heads();
        assert!(self.int8_scores::<C>(q.d) && self.fuses_masked::<C>(q.d));
        assert!(matches!(self, Kernels::Avx2(t) if t.vnni()), "fused only with VNNI products");
        assert!(C::KIND == CodeKind::I8, "bitmask rows of int8 codes");
        assert!((1..=DENSE_PASS).contains(&heads) && lane0 + heads <= W && s.len() >= rows.len());
        assert!(rows.iter().all(|r| r.mask.len() == q.d / 8), "a mask of another length");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the token has `vnni` (asserted above), as in `code_scores_i8`.
        unsafe {
            super::avx512_int::masked_scores::<W>(q, rows, lane0, s)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::codes::{I8Codes, Q4Blocks, Q8Blocks};

    fn rng(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn query_codes_round_to_the_nearest_step_and_bias_every_lane() {
        let d = 128;
        let q: Vec<f32> = (0..2 * d).map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0).collect();
        let mut qc = QueryCodes::default();
        qc.quantize(&q, d);
        let v = qc.view(0..2);
        for (h, qh) in q.chunks_exact(d).enumerate() {
            let max = qh.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_eq!(v.scales[h], max / 127.0);
            for (i, x) in qh.iter().enumerate() {
                let back = f32::from(v.codes[h * d + i]) * v.scales[h];
                assert!((back - x).abs() <= v.scales[h] * 0.5 * (1.0 + 1e-5), "h={h} i={i}");
            }
            for lane in 0..LANES {
                let mut sum = 0;
                for chunk in 0..d / CHUNK {
                    let at = h * d + chunk * CHUNK + 4 * lane;
                    let b: i32 = v.codes[at..at + 4].iter().map(|&c| i32::from(c)).sum();
                    assert_eq!(v.bias[(h * (d / CHUNK) + chunk) * LANES + lane], -128 * b);
                    sum -= 128 * b;
                }
                assert_eq!(v.total[h * LANES + lane], sum);
            }
        }
        let one = qc.view(1..2);
        assert_eq!((one.codes, one.scales), (&v.codes[d..], &v.scales[1..]));
        qc.quantize(&vec![0.0; d], d);
        assert!(qc.view(0..1).codes.iter().all(|&c| c == 0) && qc.view(0..1).scales[0] == 0.0);
    }

    /// A key row's value `i` as the kernels read it (`C` int8 codes, `q8_0` or `q4_0`
    /// blocks).
    fn key_value<C: Codes>(row: &CodeRow<'_>, i: usize) -> f64 {
        let scale = f64::from(row.scale);
        let block = |bytes: usize| {
            let b = &row.bytes[i / 32 * bytes..];
            (f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()), &b[2..])
        };
        match C::KIND {
            CodeKind::I8 => f64::from(row.bytes[i] as i8) * scale,
            CodeKind::Q4Blocks => {
                let (s, codes) = block(18);
                let byte = codes[i % 16];
                let nibble = if i % 32 < 16 { byte & 0x0f } else { byte >> 4 };
                (f64::from(nibble) - 8.0) * s * scale
            }
            _ => {
                let (s, codes) = block(34);
                f64::from(codes[i % 32] as i8) * s * scale
            }
        }
    }

    /// The kernels that take int8 queries on this CPU: AVX2's integer products and, where
    /// the CPU has them, AVX-512 VNNI's.
    fn int8_kernels() -> Vec<Kernels> {
        crate::Isa::available()
            .filter_map(|isa| Kernels::new(isa).and_then(|k| k.with_int8_queries(true)))
            .collect()
    }

    fn check_scores<C: Codes>(
        k: Kernels,
        d: usize,
        rows: &[CodeRow<'_>],
        next: &mut impl FnMut() -> u64,
    ) {
        for heads in 1..=DENSE_PASS {
            let q: Vec<f32> =
                (0..heads * d).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
            let mut qc = QueryCodes::default();
            qc.quantize(&q, d);
            let v = qc.view(0..heads);
            let mut s = vec![[f32::NAN; 8]; rows.len()];
            k.code_scores_i8::<C, 8>(v, rows, 2, &mut s);
            let mut exact = vec![[0.0f32; 4]; rows.len()];
            k.code_scores::<C, 4>(&q, d, rows, 0, &mut exact);
            for (t, row) in rows.iter().enumerate() {
                for h in 0..heads {
                    let (mut coded, mut abs) = (0.0f64, 0.0f64);
                    for i in 0..d {
                        let kv = key_value::<C>(row, i);
                        coded += f64::from(v.codes[h * d + i]) * kv;
                        abs += kv.abs();
                    }
                    coded *= f64::from(v.scales[h]);
                    let got = f64::from(s[t][2 + h]);
                    let what = format!("{:?} d={d} heads={heads} t={t} h={h}", C::KIND);
                    // Integer sums are exact: only the f32 scale products round.
                    assert!((got - coded).abs() <= 1e-5 * (1.0 + abs), "{what}: {got} vs {coded}");
                    // Against the f32 queries, the query rounding bound.
                    let bound = f64::from(v.scales[h]) / 2.0 * abs * (1.0 + 1e-4) + 1e-5;
                    let e = (got - f64::from(exact[t][h])).abs();
                    assert!(e <= bound, "{what}: error {e} over the rounding bound {bound}");
                }
                assert!(s[t][..2].iter().chain(&s[t][2 + heads..]).all(|x| x.is_nan()));
            }
        }
    }

    #[test]
    fn integer_scores_match_the_rounded_queries_and_stay_within_the_rounding_bound() {
        let kernels = int8_kernels();
        if kernels.is_empty() {
            println!("SKIPPED: integer score products need AVX2 on this CPU");
            return;
        }
        for k in kernels {
            let mut next = rng(0x9e37_79b9_7f4a_7c15);
            for d in [64usize, 128, 256] {
                // Per-component int8 rows, every code including −128 and 127.
                let flat: Vec<Vec<u8>> = (0..9)
                    .map(|t| {
                        (0..d)
                            .map(|i| if t == 0 { [0x80u8, 0x7f][i % 2] } else { next() as u8 })
                            .collect()
                    })
                    .collect();
                let rows: Vec<CodeRow<'_>> = flat
                    .iter()
                    .enumerate()
                    .map(|(t, b)| CodeRow { bytes: b, scale: 0.01 + t as f32 / 64.0 })
                    .collect();
                check_scores::<I8Codes>(k, d, &rows, &mut next);
                // q8_0 / q4_0 rows: blocks of an f16 scale and 32 codes (16 bytes of nibbles),
                // row 0 with the extreme codes.
                for codes in [32usize, 16] {
                    let blocks: Vec<Vec<u8>> = (0..9)
                        .map(|t| {
                            (0..d / 32)
                                .flat_map(|b| {
                                    let s = half::f16::from_f32(0.02 + (t * 7 + b) as f32 / 300.0);
                                    let extreme = [0x80u8, 0x7f, 0x0f, 0xf0][b % 4];
                                    let code = |_| if t == 0 { extreme } else { next() as u8 };
                                    s.to_le_bytes()
                                        .into_iter()
                                        .chain((0..codes).map(code))
                                        .collect::<Vec<_>>()
                                })
                                .collect()
                        })
                        .collect();
                    let rows: Vec<CodeRow<'_>> =
                        blocks.iter().map(|b| CodeRow { bytes: b, scale: 1.5 }).collect();
                    if codes == 32 {
                        check_scores::<Q8Blocks>(k, d, &rows, &mut next);
                    } else {
                        check_scores::<Q4Blocks>(k, d, &rows, &mut next);
                    }
                }
            }
        }
    }

    #[test]
    fn integer_scores_of_bitmask_rows_in_place_match_placed_rows() {
        let Some(k) = Kernels::new(crate::Isa::Avx512)
            .and_then(|k| k.with_int8_queries(true))
            .filter(|k| k.fuses_masked::<I8Codes>(64))
        else {
            println!("SKIPPED: bitmask rows are scored in place only with AVX-512 VNNI");
            return;
        };
        let mut next = rng(0x2545_f491_4f6c_dd1d);
        for d in [64usize, 128, 192] {
            for cut in [0usize, 1, 9] {
                let (mut bytes, mut starts) = (Vec::new(), Vec::new());
                for t in 0..13 {
                    starts.push(bytes.len());
                    let mask: Vec<u8> = (0..d / 8)
                        .map(|_| if t == 4 { 0 } else { next() as u8 & next() as u8 | 1 })
                        .collect();
                    let kept: usize = mask.iter().map(|m| m.count_ones() as usize).sum();
                    bytes.extend(&mask);
                    if kept > 0 {
                        bytes.extend(half::f16::from_f32(0.25 + t as f32 / 8.0).to_le_bytes());
                    }
                    bytes.extend((0..kept).map(|_| next() as u8));
                }
                bytes.truncate(bytes.len() - cut);
                starts.push(bytes.len() + 3);
                let n = starts.len();
                let (mut placed, mut scales) = (vec![0u8; n * d], vec![0.0f32; n]);
                k.place_bitmask_rows(&bytes, &starts, d, 2, 0.75, &mut placed, &mut scales);
                let code_rows: Vec<CodeRow<'_>> = placed
                    .chunks_exact(d)
                    .zip(&scales)
                    .map(|(b, &scale)| CodeRow { bytes: b, scale })
                    .collect();
                let mut in_place = vec![MaskedRow::EMPTY; n];
                k.masked_rows(&bytes, &starts, d, 2, 0.75, &mut in_place);
                for heads in [1usize, 3, 4] {
                    let q: Vec<f32> =
                        (0..heads * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
                    let mut qc = QueryCodes::default();
                    qc.quantize(&q, d);
                    let (mut a, mut b) = (vec![[0.0f32; 4]; n], vec![[0.0f32; 4]; n]);
                    k.code_scores_i8::<I8Codes, 4>(qc.view(0..heads), &code_rows, 0, &mut a);
                    k.masked_scores_i8::<I8Codes, 4>(qc.view(0..heads), &in_place, 0, &mut b);
                    assert_eq!(a, b, "d={d} cut={cut} heads={heads}");
                }
            }
        }
    }

    #[test]
    fn kernels_without_int8_queries_never_take_the_integer_products() {
        for isa in crate::Isa::available() {
            let k = Kernels::new(isa).expect("available");
            assert!(!k.int8_scores::<I8Codes>(64) && !k.int8_scores::<Q8Blocks>(128));
            assert_eq!(k.with_int8_queries(true).is_some(), isa != crate::Isa::Portable);
            if let Some(k) = k.with_int8_queries(true) {
                assert!(k.int8_scores::<Q8Blocks>(64) && k.int8_scores::<I8Codes>(512));
                assert!(k.int8_scores::<Q4Blocks>(128));
                assert!(!k.int8_scores::<I8Codes>(32) && !k.int8_scores::<I8Codes>(576));
                assert!(!k.int8_scores::<crate::cpu::codes::Fp8Codes>(64));
                assert!(!k.with_int8_queries(false).expect("always").int8_scores::<I8Codes>(64));
            }
        }
    }
}
