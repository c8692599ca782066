//! In-place kernels over histories of codes with shared parameters
//! ([`kv_sparse::decoded::RowCodes`]): the TurboQuant-style codebook rows (arXiv 2504.19874,
//! §3.1) and KIVI's per-channel key groups and per-token value groups (arXiv 2402.02750,
//! §3), the equal-footing formats beside SWAN's sparse rows.
//!
//! Nothing is decoded into rows: a row's codes are unpacked (a byte per code, on the stack)
//! and every code is turned into its value in a register, once for every q-head of the
//! GQA group (queries and accumulators transposed, `[dim][lane]`, as for sparse rows):
//! * codebook keys: `s = norm · Σ_c q_c · levels[code_c]` (the norm applied once per row);
//! * sketched codebook keys (QJL): the same plus `norm · γ · Σ_i (√(π/2)/d · S·q)_i · sign_i`,
//!   `S·q` formed once per segment;
//! * KIVI keys: per token group, `q·z` and `q_c·scale_c` are formed once; a row's score is
//!   then `q·z + Σ_c (q_c·scale_c) · code_c` — the codes' own integers times prepared
//!   products;
//! * codebook values: `acc_c += (p · norm) · levels[code_c]`;
//! * KIVI values: `acc_c += (p · scale_g) · code_c`, with `p · zero_g` summed per channel
//!   group and added once per segment.
//!
//! The loops are written for the compiler's vectorizer over the `W` lanes and compiled
//! once per ISA (AVX-512, AVX2 + FMA + F16C, portable), chosen at run time. Codebook and
//! KIVI keys and values of 2 to 4 bits skip them on x86-64 with AVX2 ([`super::avx2_books`]
//! turns eight codes into levels at once in a register and keeps queries and accumulators
//! head-major, as the dense kernels do): KIVI's key groups prepared once per group with
//! vector f16 conversions, its value rows weighted per channel group and their zeros added
//! once per tile.

use std::ops::Range;

use half::f16;
use kv_sparse::decoded::{RowCodes, packed_bytes, unpack_row};

use super::engine::{Item, Job};
use super::segment::{Scratch, Slot, transpose_in, transpose_out, transposed_queries};
use super::tile::{Kernels, TILE};
use crate::views::GatheredCodedKv;

/// Whether [`coded_segment`] reads this layout as keys.
pub(crate) fn reads_keys(codes: &RowCodes<'_>) -> bool {
    matches!(
        codes,
        RowCodes::Codebook { .. }
            | RowCodes::CodebookSketch { .. }
            | RowCodes::TokenGroups { .. }
            | RowCodes::ChannelGroups { .. }
    )
}

/// Whether [`coded_segment`] reads this layout as values (a sketched value row would cost
/// `d²` a row: such rows go through the decoder instead).
pub(crate) fn reads_values(codes: &RowCodes<'_>) -> bool {
    matches!(
        codes,
        RowCodes::Codebook { .. } | RowCodes::TokenGroups { .. } | RowCodes::ChannelGroups { .. }
    )
}

/// Parameter `i` of a run of little-endian f16 values.
#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32()
}

/// `acc += q · x`, lane by lane.
#[inline(always)]
fn add_scaled<const W: usize>(acc: &mut [f32; W], q: &[f32; W], x: f32) {
    for (a, q) in acc.iter_mut().zip(q) {
        *a += q * x;
    }
}

/// A codebook's levels in a table every `u8` code indexes (zeros past the codebook).
fn level_table(codes: &RowCodes<'_>) -> [f32; 256] {
    let mut table = [0.0; 256];
    if let RowCodes::Codebook { levels, .. } | RowCodes::CodebookSketch { levels, .. } = codes {
        let n = levels.len().min(256);
        table[..n].copy_from_slice(&levels[..n]);
    }
    table
}

/// What one segment reads and where it keeps its per-group products.
struct Segment<'a, 'b, const W: usize> {
    keys: RowCodes<'a>,
    values: RowCodes<'a>,
    /// Slab row of each row (gathered rows; `None`: row `j` is slab row `j`).
    slots: Option<&'a [u32]>,
    d: usize,
    /// Scaled transposed queries.
    qt: &'b [[f32; W]],
    /// Transposed accumulators.
    acc: &'b mut [[f32; W]],
    /// Token-group keys: `q_c · scale_c` of the prepared group.
    qs: &'b mut [[f32; W]],
    /// Channel-group values: `Σ p · zero_g` per group.
    zs: &'b mut [[f32; W]],
    /// Sketched keys: `√(π/2)/d · S·q`, transposed.
    sq: &'b [[f32; W]],
    /// Token-group keys: the prepared group and its `q · zero`.
    group: usize,
    qz: [f32; W],
    key_levels: [f32; 256],
    value_levels: [f32; 256],
    /// One row's codes, a `u8` each (rows of up to 256 elements; wider rows use `wide`).
    codes: [u8; 256],
    /// One row's codes for rows wider than 256 elements.
    wide: &'b mut [u8],
}

/// The codes of one row (`d` bytes): in the stack array up to 256, else in `wide`.
#[inline(always)]
fn row_codes<'c>(codes: &'c [u8; 256], wide: &'c [u8], d: usize) -> &'c [u8] {
    if d <= 256 { &codes[..d] } else { &wide[..d] }
}

/// [`row_codes`], to unpack into.
#[inline(always)]
fn row_codes_mut<'c>(codes: &'c mut [u8; 256], wide: &'c mut [u8], d: usize) -> &'c mut [u8] {
    if d <= 256 { &mut codes[..d] } else { &mut wide[..d] }
}

impl<const W: usize> Segment<'_, '_, W> {
    /// Slab row of row `j`.
    #[inline(always)]
    fn at(&self, j: usize) -> usize {
        self.slots.map_or(j, |s| s[j] as usize)
    }

    /// Log2-domain scores of key row `j`.
    #[inline(always)]
    fn score(&mut self, j: usize) -> [f32; W] {
        let d = self.d;
        let j = self.at(j);
        let mut s = [0.0f32; W];
        match self.keys {
            RowCodes::Codebook { bits, bytes, .. } => {
                let rb = 2 + packed_bytes(d, bits);
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[2..], bits, row_codes_mut(&mut self.codes, self.wide, d));
                for (q, &c) in self.qt[..d].iter().zip(row_codes(&self.codes, self.wide, d)) {
                    add_scaled(&mut s, q, self.key_levels[usize::from(c)]);
                }
                let norm = f16_at(row, 0);
                s.iter_mut().for_each(|x| *x *= norm);
            }
            RowCodes::CodebookSketch { bits, bytes, .. } => {
                let cb = packed_bytes(d, bits);
                let rb = 4 + cb + d / 8;
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[4..4 + cb], bits, row_codes_mut(&mut self.codes, self.wide, d));
                for (q, &c) in self.qt[..d].iter().zip(row_codes(&self.codes, self.wide, d)) {
                    add_scaled(&mut s, q, self.key_levels[usize::from(c)]);
                }
                let mut sketched = [0.0f32; W];
                let signs = &row[4 + cb..];
                for (i, sq) in self.sq[..d].iter().enumerate() {
                    let sign = if signs[i / 8] >> (i % 8) & 1 == 1 { 1.0 } else { -1.0 };
                    add_scaled(&mut sketched, sq, sign);
                }
                let (norm, gamma) = (f16_at(row, 0), f16_at(row, 1));
                for (x, k) in s.iter_mut().zip(&sketched) {
                    *x = norm * (*x + gamma * k);
                }
            }
            RowCodes::TokenGroups { bits, group, bytes, coded, waiting } => {
                if j >= coded {
                    let row = &waiting[(j - coded) * d..(j - coded + 1) * d];
                    for (q, x) in self.qt[..d].iter().zip(row) {
                        add_scaled(&mut s, q, x.to_f32());
                    }
                    return s;
                }
                let cb = packed_bytes(d, bits);
                let unit = 4 * d + group * cb;
                let g = j / group;
                let base = &bytes[g * unit..(g + 1) * unit];
                if self.group != g {
                    self.qz = [0.0; W];
                    for (c, (qs, q)) in self.qs[..d].iter_mut().zip(&self.qt[..d]).enumerate() {
                        let (scale, zero) = (f16_at(base, 2 * c), f16_at(base, 2 * c + 1));
                        for ((o, z), q) in qs.iter_mut().zip(self.qz.iter_mut()).zip(q) {
                            *o = q * scale;
                            *z += q * zero;
                        }
                    }
                    self.group = g;
                }
                unpack_row(
                    &base[4 * d + (j % group) * cb..][..cb],
                    bits,
                    row_codes_mut(&mut self.codes, self.wide, d),
                );
                s = self.qz;
                for (q, &c) in self.qs[..d].iter().zip(row_codes(&self.codes, self.wide, d)) {
                    add_scaled(&mut s, q, f32::from(c));
                }
            }
            RowCodes::ChannelGroups { bits, group, bytes } => {
                let params = 4 * (d / group);
                let rb = params + packed_bytes(d, bits);
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[params..], bits, row_codes_mut(&mut self.codes, self.wide, d));
                let groups = self.qt[..d]
                    .chunks(group)
                    .zip(row_codes(&self.codes, self.wide, d).chunks(group));
                for (g, (qg, cg)) in groups.enumerate() {
                    let (scale, zero) = (f16_at(row, 2 * g), f16_at(row, 2 * g + 1));
                    for (q, &c) in qg.iter().zip(cg) {
                        add_scaled(&mut s, q, zero + scale * f32::from(c));
                    }
                }
            }
            _ => unreachable!("coded_segment runs only layouts `reads_keys` accepts"),
        }
        s
    }

    /// Adds value row `j` weighted by `p` to the accumulators.
    #[inline(always)]
    fn accumulate(&mut self, j: usize, p: &[f32; W]) {
        let d = self.d;
        let j = self.at(j);
        match self.values {
            RowCodes::Codebook { bits, bytes, .. } => {
                let rb = 2 + packed_bytes(d, bits);
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[2..], bits, row_codes_mut(&mut self.codes, self.wide, d));
                let norm = f16_at(row, 0);
                let w = p.map(|x| x * norm);
                for (a, &c) in self.acc[..d].iter_mut().zip(row_codes(&self.codes, self.wide, d)) {
                    add_scaled(a, &w, self.value_levels[usize::from(c)]);
                }
            }
            RowCodes::ChannelGroups { bits, group, bytes } => {
                let params = 4 * (d / group);
                let rb = params + packed_bytes(d, bits);
                let row = &bytes[j * rb..(j + 1) * rb];
                unpack_row(&row[params..], bits, row_codes_mut(&mut self.codes, self.wide, d));
                let groups = self.acc[..d]
                    .chunks_mut(group)
                    .zip(row_codes(&self.codes, self.wide, d).chunks(group));
                for (g, ((ag, cg), zs)) in groups.zip(self.zs.iter_mut()).enumerate() {
                    let (scale, zero) = (f16_at(row, 2 * g), f16_at(row, 2 * g + 1));
                    add_scaled(zs, p, zero);
                    let w = p.map(|x| x * scale);
                    for (a, &c) in ag.iter_mut().zip(cg) {
                        add_scaled(a, &w, f32::from(c));
                    }
                }
            }
            RowCodes::TokenGroups { bits, group, bytes, coded, waiting } => {
                if j >= coded {
                    let row = &waiting[(j - coded) * d..(j - coded + 1) * d];
                    for (a, x) in self.acc[..d].iter_mut().zip(row) {
                        add_scaled(a, p, x.to_f32());
                    }
                    return;
                }
                let cb = packed_bytes(d, bits);
                let base = &bytes[(j / group) * (4 * d + group * cb)..];
                unpack_row(
                    &base[4 * d + (j % group) * cb..][..cb],
                    bits,
                    row_codes_mut(&mut self.codes, self.wide, d),
                );
                for (c, (a, &code)) in
                    self.acc[..d].iter_mut().zip(row_codes(&self.codes, self.wide, d)).enumerate()
                {
                    let (scale, zero) = (f16_at(base, 2 * c), f16_at(base, 2 * c + 1));
                    add_scaled(a, p, zero + scale * f32::from(code));
                }
            }
            _ => unreachable!("coded_segment runs only layouts `reads_values` accepts"),
        }
    }

    /// Streams rows `range` through the online softmax of `slot`; with `capture`, the
    /// log2-domain scores of row `j` land at `capture[(j − start)·W..]`.
    #[inline(always)]
    fn run(
        &mut self,
        k: Kernels,
        range: Range<usize>,
        slot: &mut Slot,
        mut capture: Option<&mut [f32]>,
    ) {
        let mut s = [[0.0f32; W]; TILE];
        let mut r = range.start;
        while r < range.end {
            let n = TILE.min(range.end - r);
            for (t, st) in s[..n].iter_mut().enumerate() {
                *st = self.score(r + t);
            }
            if let Some(c) = capture.as_deref_mut() {
                let at = (r - range.start) * W;
                c[at..at + n * W].copy_from_slice(s[..n].as_flattened());
            }
            let (m, l) = slot.lanes::<W>();
            let factor = k.softmax_update(m, l, &mut s[..n]);
            for a in self.acc[..self.d].iter_mut().chain(self.zs.iter_mut()) {
                a.iter_mut().zip(&factor).for_each(|(x, f)| *x *= f);
            }
            for (t, p) in s[..n].iter().enumerate() {
                self.accumulate(r + t, p);
            }
            r += n;
        }
    }
}

/// [`Segment::run`] compiled for AVX-512 (F, BW) with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must support AVX-512 F and BW, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn run_avx512<const W: usize>(
    seg: &mut Segment<'_, '_, W>,
    k: Kernels,
    range: Range<usize>,
    (slot, capture): (&mut Slot, Option<&mut [f32]>),
) {
    seg.run(k, range, slot, capture);
}

/// [`Segment::run`] compiled for AVX2, FMA and F16C.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<const W: usize>(
    seg: &mut Segment<'_, '_, W>,
    k: Kernels,
    range: Range<usize>,
    (slot, capture): (&mut Slot, Option<&mut [f32]>),
) {
    seg.run(k, range, slot, capture);
}

/// `√(π/2)/d · S·q` of the transposed queries, transposed (`d` rows), in `buf`.
fn sketched_queries<'b, const W: usize>(
    sketch: &[f32],
    qt: &[[f32; W]],
    d: usize,
    buf: &'b mut Vec<f32>,
) -> &'b [[f32; W]] {
    if buf.len() < d * W {
        buf.resize(d * W, 0.0);
    }
    let (out, _) = buf[..d * W].as_chunks_mut::<W>();
    let scale = kv_sparse::turbo::sketch_scale(d);
    for (o, s_row) in out.iter_mut().zip(sketch.chunks_exact(d)) {
        *o = [0.0; W];
        for (q, &s) in qt[..d].iter().zip(s_row) {
            add_scaled(o, q, s * scale);
        }
    }
    out
}

/// Streams `item.rows` of coded keys and values (layouts [`reads_keys`] and
/// [`reads_values`] accept, checked against the head by the input validation) through
/// `slot`, continuing its softmax state.
pub(crate) fn coded_segment<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    (keys, values): (RowCodes<'_>, RowCodes<'_>),
    sc: &mut Scratch,
    slot: &mut Slot,
) {
    let rows = Rows { keys, values, slots: None, range: item.rows.clone() };
    segment::<W>(k, job, item, rows, sc, (slot, None));
}

/// Streams rows `range` of a gathered coded part (slab row `slots[j]` for row `j`) through
/// `slot`, capturing their log2-domain scores when `capture` is given.
pub(crate) fn gathered_segment<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    (kv, range): (&GatheredCodedKv<'_>, Range<usize>),
    sc: &mut Scratch,
    (slot, capture): (&mut Slot, Option<&mut [f32]>),
) {
    let rows = Rows { keys: kv.keys, values: kv.values, slots: kv.slots, range };
    segment::<W>(k, job, item, rows, sc, (slot, capture));
}

/// Streams codebook or KIVI keys and values of 2 to 4 bits (`d` a multiple of 8, KIVI's
/// value groups multiples of 8 channels) through the AVX2 kernels of
/// [`super::avx2_books`]: the queries and accumulators stay head-major and the codes turn
/// into levels in registers. KIVI keys are scored against queries prepared once per token
/// group (`q_c · scale_c` and `q·z`), its waiting f16 keys in f32. Reads nothing and returns
/// false for other layouts and for the portable kernels.
#[cfg(target_arch = "x86_64")]
fn book_segment<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    rows: &Rows<'_>,
    sc: &mut Scratch,
    (slot, capture): (&mut Slot, &mut Option<&mut [f32]>),
) -> bool {
    use super::avx2_books::{Book, MAX_VALUE_GROUPS, ValueRows, book_accumulate, identity_book};
    use super::segment::scaled_queries;
    use super::tile::DENSE_PASS;
    let d = job.cfg.head_dim();
    let fits = |bits: usize| (2..=4).contains(&bits);
    if !matches!(k, Kernels::Avx2(_)) || !d.is_multiple_of(8) {
        return false;
    }
    // SAFETY: an AVX2 token exists only after `Isa::Avx2.is_available()` confirmed AVX2, FMA
    // and F16C (so for every `unsafe` block of this function).
    let kbook = unsafe {
        match rows.keys {
            RowCodes::Codebook { bits, levels, .. } if fits(bits) => Book::new(levels, bits),
            RowCodes::TokenGroups { bits, .. } if fits(bits) => identity_book(bits),
            _ => return false,
        }
    };
    // SAFETY: as above.
    let (layout, vb) = unsafe {
        match rows.values {
            RowCodes::Codebook { bits, levels, bytes } if fits(bits) => {
                (ValueRows::Codebook(Book::new(levels, bits)), bytes)
            }
            RowCodes::ChannelGroups { bits, group, bytes }
                if fits(bits) && group.is_multiple_of(8) && d / group <= MAX_VALUE_GROUPS =>
            {
                (ValueRows::Groups { book: identity_book(bits), group }, bytes)
            }
            _ => return false,
        }
    };
    let vrb = rows.values.row_bytes(d).expect("codebook and channel-group rows have a size");
    let slots = rows.slots;
    let at = |j: usize| slots.map_or(j, |s| s[j] as usize);
    let Scratch { q, kval, .. } = sc;
    let q = scaled_queries(job.queries(item.kv, item.block), job.logit_scale(), q);
    let heads = q.len() / d;
    if kval.len() < heads * d {
        kval.resize(heads * d, 0.0);
    }
    let qs = &mut kval[..heads * d];
    let mut keys = KeyTile {
        keys: rows.keys,
        book: kbook,
        d,
        q,
        qs,
        group: usize::MAX,
        qz: [0.0; super::tile::MAX_LANES],
    };
    let mut vr = [&[][..]; TILE];
    let mut s = [[0.0f32; W]; TILE];
    let range = rows.range.clone();
    let mut r = range.start;
    while r < range.end {
        let n = TILE.min(range.end - r);
        let js: [usize; TILE] = std::array::from_fn(|t| if t < n { at(r + t) } else { 0 });
        keys.scores::<W>(&js[..n], &mut s[..n]);
        for (v, &j) in vr.iter_mut().zip(&js[..n]) {
            *v = &vb[j * vrb..(j + 1) * vrb];
        }
        if let Some(c) = capture.as_deref_mut() {
            let at = (r - range.start) * W;
            c[at..at + n * W].copy_from_slice(s[..n].as_flattened());
        }
        let (m, l) = slot.lanes::<W>();
        let factor = k.softmax_update(m, l, &mut s[..n]);
        for (pass, acc) in slot.acc[..heads * d].chunks_mut(DENSE_PASS * d).enumerate() {
            // SAFETY: as above.
            unsafe {
                book_accumulate::<W>(&layout, &s[..n], &vr[..n], pass * DENSE_PASS, &factor, acc, d)
            };
        }
        r += n;
    }
    true
}

/// The key side of [`book_segment`]: codebook rows, or KIVI's token groups with the
/// queries prepared for the group last read.
#[cfg(target_arch = "x86_64")]
struct KeyTile<'a, 'q> {
    keys: RowCodes<'a>,
    book: super::avx2_books::Book,
    d: usize,
    /// Scaled head-major queries.
    q: &'q [f32],
    /// KIVI: the queries times the channel scales of token group `group`.
    qs: &'q mut [f32],
    /// The token group `qs` and `qz` were prepared for (`usize::MAX`: none yet).
    group: usize,
    /// KIVI: `q_h · z` of token group `group`, per head.
    qz: [f32; super::tile::MAX_LANES],
}

#[cfg(target_arch = "x86_64")]
impl KeyTile<'_, '_> {
    /// Scores of rows `js` (slab rows) for every head into `s`.
    fn scores<const W: usize>(&mut self, js: &[usize], s: &mut [[f32; W]]) {
        use super::avx2_books::{book_scores, code_scores, prepare_key_group};
        use super::tile::DENSE_PASS;
        let d = self.d;
        let mut rows = [&[][..]; TILE];
        match self.keys {
            RowCodes::Codebook { bytes, .. } => {
                let rb = self.keys.row_bytes(d).expect("codebook rows have a size");
                for (row, &j) in rows.iter_mut().zip(js) {
                    *row = &bytes[j * rb..(j + 1) * rb];
                }
                for (pass, qp) in self.q.chunks(DENSE_PASS * d).enumerate() {
                    let lane0 = pass * DENSE_PASS;
                    // SAFETY: a `KeyTile` is built only on an AVX2 token (see `book_segment`).
                    unsafe { book_scores::<W>(&self.book, qp, d, &rows[..js.len()], lane0, s) };
                }
            }
            RowCodes::TokenGroups { bits, group, bytes, coded, waiting } => {
                let cb = packed_bytes(d, bits);
                let unit = 4 * d + group * cb;
                let mut t = 0;
                while t < js.len() {
                    let j = js[t];
                    if j >= coded {
                        let row = &waiting[(j - coded) * d..(j - coded + 1) * d];
                        for (h, qh) in self.q.chunks_exact(d).enumerate() {
                            s[t][h] = qh.iter().zip(row).map(|(q, x)| q * x.to_f32()).sum();
                        }
                        t += 1;
                        continue;
                    }
                    let g = j / group;
                    let base = &bytes[g * unit..(g + 1) * unit];
                    if self.group != g {
                        // SAFETY: as above.
                        unsafe { prepare_key_group(self.q, base, d, self.qs, &mut self.qz) };
                        self.group = g;
                    }
                    // The run of rows of this group.
                    let mut u = t;
                    while u < js.len() && js[u] < coded && js[u] / group == g {
                        rows[u - t] = &base[4 * d + (js[u] % group) * cb..][..cb];
                        u += 1;
                    }
                    for (pass, qp) in self.qs.chunks(DENSE_PASS * d).enumerate() {
                        let lane0 = pass * DENSE_PASS;
                        let bias = &self.qz[lane0..lane0 + qp.len() / d];
                        // SAFETY: as above.
                        unsafe {
                            code_scores::<W>(
                                &self.book,
                                qp,
                                d,
                                &rows[..u - t],
                                bias,
                                lane0,
                                &mut s[t..u],
                            )
                        };
                    }
                    t = u;
                }
            }
            _ => unreachable!("book_segment keys are codebook or token-group rows"),
        }
    }
}

/// What [`segment`] streams: layouts, slab rows and the rows to read.
struct Rows<'a> {
    keys: RowCodes<'a>,
    values: RowCodes<'a>,
    slots: Option<&'a [u32]>,
    range: Range<usize>,
}

fn segment<const W: usize>(
    k: Kernels,
    job: &Job<'_>,
    item: &Item,
    rows: Rows<'_>,
    sc: &mut Scratch,
    (slot, capture): (&mut Slot, Option<&mut [f32]>),
) {
    let mut capture = capture;
    #[cfg(target_arch = "x86_64")]
    if book_segment::<W>(k, job, item, &rows, sc, (slot, &mut capture)) {
        return;
    }
    let Rows { keys, values, slots, range } = rows;
    let d = job.cfg.head_dim();
    let Scratch { qt, acc_t, kval, vval, sq, kcode, .. } = sc;
    let wide = if d > 256 {
        if kcode.len() < d {
            kcode.resize(d, 0);
        }
        &mut kcode[..d]
    } else {
        &mut kcode[..0]
    };
    let q = job.queries(item.kv, item.block);
    let qt = transposed_queries::<u8, W>(q, d, job.logit_scale(), qt);
    let acc = transpose_in::<u8, W>(slot, d, acc_t);
    let groups = match values {
        RowCodes::ChannelGroups { group, .. } => d / group,
        _ => 0,
    };
    for (buf, len) in [(&mut *kval, d * W), (&mut *vval, groups * W)] {
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
    }
    let (qs, _) = kval[..d * W].as_chunks_mut::<W>();
    let (zs, _) = vval[..groups * W].as_chunks_mut::<W>();
    zs.fill([0.0; W]);
    let sketched = match keys {
        RowCodes::CodebookSketch { sketch, .. } => sketched_queries::<W>(sketch, qt, d, sq),
        _ => &[],
    };
    let mut seg = Segment {
        keys,
        values,
        slots,
        d,
        qt,
        acc,
        qs,
        zs,
        sq: sketched,
        group: usize::MAX,
        qz: [0.0; W],
        key_levels: level_table(&keys),
        value_levels: level_table(&values),
        codes: [0; 256],
        wide,
    };
    match k {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a token with `avx512` exists only after `Isa::Avx512.is_available()`
        // returned true, so the CPU supports AVX-512 F + BW, AVX2, FMA and F16C.
        Kernels::Avx2(t) if t.avx512() => unsafe {
            run_avx512(&mut seg, k, range, (slot, capture))
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: an AVX2 token exists only after `is_available()` confirmed AVX2, FMA and
        // F16C.
        Kernels::Avx2(_) => unsafe { run_avx2(&mut seg, k, range, (slot, capture)) },
        _ => seg.run(k, range, slot, capture),
    }
    if let RowCodes::ChannelGroups { group, .. } = values {
        for (ag, z) in seg.acc[..d].chunks_mut(group).zip(seg.zs.iter()) {
            for a in ag {
                a.iter_mut().zip(z).for_each(|(x, z)| *x += z);
            }
        }
    }
    let acc = seg.acc;
    transpose_out::<W>(acc, d, slot);
}
