//! Tile kernels over byte-coded rows, read as they are stored: dense quantized rows (int8
//! and int4 in blocks of 32 with an f16 scale — llama.cpp's `q8_0` / `q4_0` layouts — and
//! fp8 rows with a per-token scale) and SWAN's coded sparse rows with fp8 or int8 values.
//!
//! A coded sparse row (bitmask or index list, then the kept codes) is first *placed*: its
//! `k` codes are written at their components of a per-thread row of `d` codes, zeros
//! elsewhere. A bitmask places eight components per mask byte with one byte shuffle (the
//! byte selects a shuffle pattern from [`MASK_SHUFFLE`]; unkept lanes come out zero). The
//! placed row then goes through the same kernel as a dense fp8 / int8 row, its row scale
//! folded into the scores and weights. So a sparse row costs one shuffle per eight
//! components more than a dense 8-bit row while reading only its kept codes (the AVX-512
//! kernels skip the per-thread row: [`MaskedRow`]s are expanded in registers) — the
//! sparse-dense products of SWAN's method section (scores `q̂·k_j`, output `Σ a_j v_j`)
//! over the bitmask format of the frontier formats. Codes are never widened to `f32` in
//! memory: the kernels decode eight at a time in registers.
//!
//! Layouts of [`CodeRow::bytes`] per [`CodeKind`] (`d` a multiple of 8; of 32 for blocks):
//! * [`CodeKind::Fp8`]: `d` fp8 E4M3FN codes; value `i` = `decode(code_i) · scale`;
//! * [`CodeKind::I8`]: `d` `i8` codes; value `i` = `code_i · scale`;
//! * [`CodeKind::Q8Blocks`]: `d/32` blocks of an f16 scale `s_b` and 32 `i8` codes;
//!   value = `code · s_b · scale`;
//! * [`CodeKind::Q4Blocks`]: `d/32` blocks of an f16 scale `s_b` and 16 bytes, element `j`
//!   of the block in the low nibble of byte `j` and element `j + 16` in its high nibble;
//!   value = `(nibble − 8) · s_b · scale`.

use kv_sparse::fp8::DECODE_TABLE;

use super::tile::{DENSE_PASS, Kernels};

/// Elements per scale block of the blocked formats.
pub(crate) const BLOCK: usize = 32;

/// How a [`CodeRow`]'s bytes hold its values (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CodeKind {
    /// fp8 E4M3FN codes, one per component.
    Fp8,
    /// `i8` codes, one per component.
    I8,
    /// `q8_0` blocks.
    Q8Blocks,
    /// `q4_0` blocks.
    Q4Blocks,
}

/// A row format as a type, so that kernels are compiled per format (no branch on the
/// format inside a loop).
pub(crate) trait Codes: Copy + Send + Sync + 'static {
    /// The layout.
    const KIND: CodeKind;

    /// Bytes of a row of `d` components.
    fn row_bytes(d: usize) -> usize {
        match Self::KIND {
            CodeKind::Fp8 | CodeKind::I8 => d,
            CodeKind::Q8Blocks => d / BLOCK * (2 + BLOCK),
            CodeKind::Q4Blocks => d / BLOCK * (2 + BLOCK / 2),
        }
    }

    /// Whether rows of `d` components can be read by these kernels.
    fn supports(d: usize) -> bool {
        match Self::KIND {
            CodeKind::Fp8 | CodeKind::I8 => d > 0 && d.is_multiple_of(8),
            CodeKind::Q8Blocks | CodeKind::Q4Blocks => d > 0 && d.is_multiple_of(BLOCK),
        }
    }
}

/// [`CodeKind::Fp8`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fp8Codes;
/// [`CodeKind::I8`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct I8Codes;
/// [`CodeKind::Q8Blocks`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q8Blocks;
/// [`CodeKind::Q4Blocks`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Q4Blocks;

impl Codes for Fp8Codes {
    const KIND: CodeKind = CodeKind::Fp8;
}
impl Codes for I8Codes {
    const KIND: CodeKind = CodeKind::I8;
}
impl Codes for Q8Blocks {
    const KIND: CodeKind = CodeKind::Q8Blocks;
}
impl Codes for Q4Blocks {
    const KIND: CodeKind = CodeKind::Q4Blocks;
}

/// One coded row: its bytes and the factor every decoded value carries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CodeRow<'a> {
    /// The row's bytes, laid out as its [`CodeKind`] says.
    pub bytes: &'a [u8],
    /// Factor of every value (row scale times the head's value scale).
    pub scale: f32,
}

impl CodeRow<'_> {
    /// An empty row (placeholder in tile arrays).
    pub const EMPTY: CodeRow<'static> = CodeRow { bytes: &[], scale: 0.0 };
}

/// Most components a bitmask row read in place may have (the mask of a malformed row is
/// read from a zero mask of this many bits).
pub(crate) const MASKED_MAX_DIM: usize = 512;

/// Mask of a row whose mask lies past its buffer: it keeps nothing.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static NO_MASK: [u8; MASKED_MAX_DIM / 8] = [0; MASKED_MAX_DIM / 8];

/// A bitmask row of 8-bit codes read where it is stored, by the kernels that place its
/// codes in registers ([`Kernels::fuses_masked`]) instead of into a per-thread row.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MaskedRow<'a> {
    /// The row's `d/8` mask bytes.
    pub mask: &'a [u8],
    /// The buffer from the row's first kept code on: its codes, then whatever follows
    /// (codes past its end read as zero; only a malformed row reaches them).
    pub codes: &'a [u8],
    /// Factor of every value (row scale times the head's value scale).
    pub scale: f32,
}

impl MaskedRow<'_> {
    /// An empty row (placeholder in tile arrays).
    pub const EMPTY: MaskedRow<'static> = MaskedRow { mask: &[], codes: &[], scale: 0.0 };
}

/// Shuffle patterns placing a bitmask byte's kept codes: for mask byte `m`, byte `i` of
/// entry `m` is the rank of bit `i` among the set bits of `m` when bit `i` is set, else
/// `0x80` (a shuffle writes zero there).
pub(crate) static MASK_SHUFFLE: [u64; 256] = mask_shuffle_table();

const fn mask_shuffle_table() -> [u64; 256] {
    let mut table = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let (mut pattern, mut rank, mut i) = (0u64, 0u64, 0);
        while i < 8 {
            let lane = if (m >> i) & 1 == 1 {
                rank += 1;
                rank - 1
            } else {
                0x80
            };
            pattern |= lane << (8 * i);
            i += 1;
        }
        table[m] = pattern;
        m += 1;
    }
    table
}

macro_rules! dispatch_codes {
    ($k:expr, $f:ident $(::<$($g:ident),*>)? ( $($arg:expr),* $(,)? )) => {
        match $k {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: an `Avx2Token` exists only after `Isa::Avx2.is_available()` returned
            // true, so the CPU supports every feature the `avx2` functions enable.
            Kernels::Avx2(_) => unsafe { super::avx2_codes::$f$(::<$($g),*>)?($($arg),*) },
            _ => $f$(::<$($g),*>)?($($arg),*),
        }
    };
}

fn check_rows<C: Codes>(d: usize, rows: &[CodeRow<'_>]) {
    assert!(C::supports(d), "head_dim {d} is not readable as {:?}", C::KIND);
    let need = C::row_bytes(d);
    assert!(rows.iter().all(|r| r.bytes.len() >= need), "a coded row is shorter than its layout");
}

impl Kernels {
    /// `s[t][lane0 + h] = q_h · value(rows[t])` for the `heads` (≤ [`DENSE_PASS`])
    /// head-major queries in `q` (`heads × d`).
    pub fn code_scores<C: Codes, const W: usize>(
        self,
        q: &[f32],
        d: usize,
        rows: &[CodeRow<'_>],
        lane0: usize,
        s: &mut [[f32; W]],
    ) {
        let heads = q.len() / d;
        assert!(heads <= DENSE_PASS && lane0 + heads <= W && s.len() >= rows.len());
        assert!(q.len() == heads * d);
        check_rows::<C>(d, rows);
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self
            && t.avx512()
            && d.is_multiple_of(16)
        {
            // SAFETY: a token with `avx512` exists only after `Isa::Avx512.is_available()`
            // returned true, so the CPU supports AVX-512 F + BW + VBMI2, AVX2, FMA, F16C and
            // POPCNT.
            return unsafe { super::avx512::code_scores::<C, W>(q, d, rows, lane0, s) };
        }
        dispatch_codes!(self, code_scores::<C, W>(q, d, rows, lane0, s))
    }

    /// `acc_h = factor[lane0 + h] · acc_h + Σ_t p[t][lane0 + h] · value(rows[t])` for the
    /// `heads` head-major accumulators in `acc` (`heads × d`).
    pub fn code_accumulate<C: Codes, const W: usize>(
        self,
        p: &[[f32; W]],
        rows: &[CodeRow<'_>],
        lane0: usize,
        factor: &[f32; W],
        acc: &mut [f32],
        d: usize,
    ) {
        let heads = acc.len() / d;
        assert!(heads <= DENSE_PASS && lane0 + heads <= W && p.len() >= rows.len());
        assert!(acc.len() == heads * d);
        check_rows::<C>(d, rows);
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self
            && t.avx512()
            && d.is_multiple_of(16)
        {
            // SAFETY: as in `code_scores`.
            return unsafe {
                super::avx512::code_accumulate::<C, W>(p, rows, lane0, factor, acc, d)
            };
        }
        dispatch_codes!(self, code_accumulate::<C, W>(p, rows, lane0, factor, acc, d))
    }

    /// Places the codes of a bitmask row: `out[8b..8b + 8]` receives, for mask byte
    /// `mask[b]`, the next `popcount(mask[b])` codes of `src` (starting at `src[at]`) at the
    /// byte's set bits, zeros at its clear bits. `out.len() == 8 · mask.len()`; codes
    /// beyond `src` read as zero (only a malformed row reaches them).
    pub fn place_masked(self, mask: &[u8], src: &[u8], at: usize, out: &mut [u8]) {
        assert_eq!(out.len(), 8 * mask.len(), "placed row length");
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self
            && t.vbmi2()
        {
            // SAFETY: a token with `vbmi2` exists only after `Isa::Avx2Vbmi2.is_available()`
            // returned true, so the CPU supports AVX-512 F + BW + VBMI2 and POPCNT.
            return unsafe { super::avx512_codes::place_masked(mask, src, at, out) };
        }
        dispatch_codes!(self, place_masked(mask, src, at, out))
    }

    /// Places the bitmask rows of `bytes` that start at `starts` (each: `d/8` mask bytes,
    /// an f16 scale of `scale_bytes` (0 or 2) bytes when the mask keeps any component, the
    /// kept codes) into `out` (`d` codes per row, as [`Kernels::place_masked`] places one),
    /// and writes row `t`'s scale (1 without one) times `factor` into `scales[t]`. A row
    /// whose mask lies past `bytes` (only a malformed view has one) places as zeros.
    #[allow(clippy::too_many_arguments)]
    pub fn place_bitmask_rows(
        self,
        bytes: &[u8],
        starts: &[usize],
        d: usize,
        scale_bytes: usize,
        factor: f32,
        out: &mut [u8],
        scales: &mut [f32],
    ) {
        assert!(
            d.is_multiple_of(8) && (scale_bytes == 0 || scale_bytes == 2),
            "bitmask row layout"
        );
        assert!(out.len() >= starts.len() * d && scales.len() >= starts.len(), "placed rows");
        #[cfg(target_arch = "x86_64")]
        if let Kernels::Avx2(t) = self
            && t.vbmi2()
        {
            // SAFETY: a token with `vbmi2` exists only after `Isa::Avx2Vbmi2.is_available()`
            // returned true, so the CPU supports AVX-512 F + BW + VBMI2, F16C and POPCNT.
            return unsafe {
                super::avx512_codes::place_bitmask_rows(
                    bytes,
                    starts,
                    d,
                    scale_bytes,
                    factor,
                    out,
                    scales,
                )
            };
        }
        dispatch_codes!(
            self,
            place_bitmask_rows(bytes, starts, d, scale_bytes, factor, out, scales)
        )
    }
}

impl Kernels {
    /// Whether bitmask rows of `d` components with codes `C` are read in place
    /// ([`Kernels::masked_rows`], [`Kernels::masked_scores`], [`Kernels::masked_accumulate`]):
    /// the AVX-512 kernels (with int8 queries, on a CPU with AVX-512 VNNI), fp8 or int8
    /// codes, `d` a multiple of 64 up to [`MASKED_MAX_DIM`]. Other rows are placed
    /// ([`Kernels::place_bitmask_rows`]).
    pub fn fuses_masked<C: Codes>(self, d: usize) -> bool {
        // With int8 queries but no VNNI products, bitmask rows are placed and scored by
        // AVX2's integer products instead.
        let kernels = match self {
            Kernels::Avx2(t) => t.avx512() && (t.vnni() || !self.int8_queries()),
            Kernels::Portable => false,
        };
        kernels
            && matches!(C::KIND, CodeKind::Fp8 | CodeKind::I8)
            && d > 0
            && d.is_multiple_of(64)
            && d <= MASKED_MAX_DIM
    }

    /// The bitmask rows of `bytes` that start at `starts` (laid out as
    /// [`Kernels::place_bitmask_rows`] reads them) as rows read in place, each row's scale
    /// (1 without one) times `factor` in its [`MaskedRow::scale`]. A row whose mask lies
    /// past `bytes` keeps nothing. Only where [`Kernels::fuses_masked`] holds for `d`.
    pub fn masked_rows<'a>(
        self,
        bytes: &'a [u8],
        starts: &[usize],
        d: usize,
        scale_bytes: usize,
        factor: f32,
        rows: &mut [MaskedRow<'a>],
    ) {
        assert!(self.fuses_masked::<I8Codes>(d), "no in-place kernels for bitmask rows of {d}");
        assert!(scale_bytes == 0 || scale_bytes == 2, "bitmask row layout");
        assert!(rows.len() >= starts.len(), "masked rows");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `fuses_masked` holds only for a token with `avx512`, which exists only
        // after `Isa::Avx512.is_available()` returned true (AVX-512 F + BW + VBMI2, F16C).
        unsafe {
            super::avx512::masked_rows(bytes, starts, d, scale_bytes, factor, rows)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (bytes, factor);
    }

    /// [`Kernels::code_scores`] over bitmask rows read in place: `s[t][lane0 + h] = q_h ·
    /// value(rows[t])`. Only where [`Kernels::fuses_masked`] holds for `C` and `d`.
    pub fn masked_scores<C: Codes, const W: usize>(
        self,
        q: &[f32],
        d: usize,
        rows: &[MaskedRow<'_>],
        lane0: usize,
        s: &mut [[f32; W]],
    ) {
        let heads = q.len() / d;
        assert!(self.fuses_masked::<C>(d), "no in-place kernels for these bitmask rows");
        assert!(heads <= DENSE_PASS && lane0 + heads <= W && s.len() >= rows.len());
        assert!(q.len() == heads * d);
        assert!(rows.iter().all(|r| r.mask.len() == d / 8), "a mask of another length");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `masked_rows`.
        unsafe {
            super::avx512::masked_scores::<C, W>(q, d, rows, lane0, s)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (q, s);
    }

    /// [`Kernels::code_accumulate`] over bitmask rows read in place: `acc_h =
    /// factor[lane0 + h] · acc_h + Σ_t p[t][lane0 + h] · value(rows[t])`. Only where
    /// [`Kernels::fuses_masked`] holds for `C` and `d`.
    pub fn masked_accumulate<C: Codes, const W: usize>(
        self,
        p: &[[f32; W]],
        rows: &[MaskedRow<'_>],
        lane0: usize,
        factor: &[f32; W],
        acc: &mut [f32],
        d: usize,
    ) {
        let heads = acc.len() / d;
        assert!(self.fuses_masked::<C>(d), "no in-place kernels for these bitmask rows");
        assert!(heads <= DENSE_PASS && lane0 + heads <= W && p.len() >= rows.len());
        assert!(acc.len() == heads * d);
        assert!(rows.iter().all(|r| r.mask.len() == d / 8), "a mask of another length");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `masked_rows`.
        unsafe {
            super::avx512::masked_accumulate::<C, W>(p, rows, lane0, factor, acc, d)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = factor;
    }
}

fn place_bitmask_rows(
    bytes: &[u8],
    starts: &[usize],
    d: usize,
    scale_bytes: usize,
    factor: f32,
    out: &mut [u8],
    scales: &mut [f32],
) {
    for ((&start, o), sc) in starts.iter().zip(out.chunks_exact_mut(d)).zip(scales) {
        let Some((mask, at, any)) = bitmask_row(bytes, start, d, scale_bytes) else {
            o.fill(0);
            *sc = factor;
            continue;
        };
        place_masked(mask, bytes, at, o);
        let f16 = |b| half::f16::from_le_bytes(b).to_f32();
        *sc = bitmask_scale(bytes, at, scale_bytes, any, f16) * factor;
    }
}

/// The parts of the bitmask row at `start` of `bytes` (`d/8` mask bytes, then an f16
/// scale of `scale_bytes` (0 or 2) bytes when the mask keeps any component, then the kept
/// codes): its mask (`None` past the buffer), the offset of its first code, and whether it
/// keeps any component.
#[inline]
pub(crate) fn bitmask_row(
    bytes: &[u8],
    start: usize,
    d: usize,
    scale_bytes: usize,
) -> Option<(&[u8], usize, bool)> {
    let mask = bytes.get(start..start.checked_add(d / 8)?)?;
    let any = mask.iter().any(|&m| m != 0);
    Some((mask, start + d / 8 + scale_bytes, any))
}

/// The f16 scale of a bitmask row whose codes start at `codes_at` (1 without one, or for a
/// row that keeps nothing, whose zeros must stay zeros).
#[inline]
pub(crate) fn bitmask_scale(
    bytes: &[u8],
    codes_at: usize,
    scale_bytes: usize,
    any: bool,
    f16: impl Fn([u8; 2]) -> f32,
) -> f32 {
    match bytes.get(codes_at.wrapping_sub(2)..codes_at) {
        Some(&[a, b]) if any && scale_bytes == 2 => f16([a, b]),
        _ => 1.0,
    }
}

/// Value `i` of a row (without the row's `scale`).
fn value<C: Codes>(bytes: &[u8], i: usize) -> f32 {
    match C::KIND {
        CodeKind::Fp8 => DECODE_TABLE[usize::from(bytes[i])],
        CodeKind::I8 => f32::from(bytes[i] as i8),
        CodeKind::Q8Blocks => {
            let b = &bytes[i / BLOCK * (2 + BLOCK)..];
            f32::from(b[2 + i % BLOCK] as i8) * block_scale(b)
        }
        CodeKind::Q4Blocks => {
            let b = &bytes[i / BLOCK * (2 + BLOCK / 2)..];
            let (j, high) = (i % BLOCK % (BLOCK / 2), i % BLOCK >= BLOCK / 2);
            let nibble = if high { b[2 + j] >> 4 } else { b[2 + j] & 0x0f };
            f32::from(nibble as i8 - 8) * block_scale(b)
        }
    }
}

/// The f16 scale at the start of a block (converted inline, without `half`'s run-time
/// dispatch: it is read once per row in the hot loop).
#[inline]
pub(crate) fn block_scale(block: &[u8]) -> f32 {
    half::f16::from_le_bytes([block[0], block[1]]).to_f32_const()
}

fn code_scores<C: Codes, const W: usize>(
    q: &[f32],
    d: usize,
    rows: &[CodeRow<'_>],
    lane0: usize,
    s: &mut [[f32; W]],
) {
    for (row, st) in rows.iter().zip(s.iter_mut()) {
        for (h, qh) in q.chunks_exact(d).enumerate() {
            let dot: f32 = qh.iter().enumerate().map(|(i, x)| x * value::<C>(row.bytes, i)).sum();
            st[lane0 + h] = dot * row.scale;
        }
    }
}

fn code_accumulate<C: Codes, const W: usize>(
    p: &[[f32; W]],
    rows: &[CodeRow<'_>],
    lane0: usize,
    factor: &[f32; W],
    acc: &mut [f32],
    d: usize,
) {
    for (h, acc_h) in acc.chunks_exact_mut(d).enumerate() {
        let f = factor[lane0 + h];
        acc_h.iter_mut().for_each(|a| *a *= f);
        for (pt, row) in p.iter().zip(rows) {
            let w = pt[lane0 + h] * row.scale;
            for (i, a) in acc_h.iter_mut().enumerate() {
                *a += w * value::<C>(row.bytes, i);
            }
        }
    }
}

fn place_masked(mask: &[u8], src: &[u8], at: usize, out: &mut [u8]) {
    let mut pos = at;
    for (&m, o) in mask.iter().zip(out.chunks_exact_mut(8)) {
        for (i, x) in o.iter_mut().enumerate() {
            *x = if (m >> i) & 1 == 1 {
                pos += 1;
                src.get(pos - 1).copied().unwrap_or(0)
            } else {
                0
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_patterns_place_ranks() {
        for (m, pattern) in MASK_SHUFFLE.iter().enumerate() {
            let p = pattern.to_le_bytes();
            let mut rank = 0u8;
            for (i, &lane) in p.iter().enumerate() {
                if (m >> i) & 1 == 1 {
                    assert_eq!(lane, rank);
                    rank += 1;
                } else {
                    assert_eq!(lane, 0x80);
                }
            }
        }
    }

    #[test]
    fn placing_every_mask_byte_matches_the_scalar_rule() {
        let src: Vec<u8> = (1..=40).collect();
        for isa in crate::Isa::available() {
            let k = Kernels::new(isa).expect("available");
            for m in 0..256usize {
                let mask = [m as u8, !(m as u8), 0x81];
                for at in [0, 3, 30, 39] {
                    let mut got = [0xffu8; 24];
                    k.place_masked(&mask, &src, at, &mut got);
                    let mut want = [0xffu8; 24];
                    place_masked(&mask, &src, at, &mut want);
                    assert_eq!(got, want, "{isa} mask {m:#04x} at {at}");
                }
            }
        }
    }

    /// Tiles of bitmask rows placed at once equal rows placed one by one: rows that keep
    /// nothing (their scale is 1 even where the next bytes spell an f16 NaN), rows with and
    /// without a scale, and a start past the buffer (zeros).
    #[test]
    fn placing_a_tile_of_bitmask_rows_matches_row_by_row() {
        let d = 24;
        // Row 0 keeps 3 codes, row 1 nothing (followed by 0x7e 0x7f: an f16 NaN), row 2 two.
        let mut bytes = vec![0b1000_0001, 0, 0b0001_0000, 0x00, 0x3c, 7, 8, 9];
        bytes.extend([0, 0, 0, 0xff, 0x7f]);
        bytes.extend([0, 0b0000_0011, 0, 0x00, 0x40, 5, 6]);
        let starts = [0, 8, 13, 400];
        for isa in crate::Isa::available() {
            let k = Kernels::new(isa).expect("available");
            for scale_bytes in [0, 2] {
                let mut out = vec![0xeeu8; starts.len() * d];
                let mut scales = [0.0f32; 4];
                k.place_bitmask_rows(&bytes, &starts, d, scale_bytes, 0.5, &mut out, &mut scales);
                for (t, &start) in starts.iter().enumerate() {
                    let mut want = vec![0u8; d];
                    let mut scale = 1.0;
                    if let Some(mask) = bytes.get(start..start + d / 8) {
                        place_masked(mask, &bytes, start + d / 8 + scale_bytes, &mut want);
                        if scale_bytes == 2 && mask.iter().any(|&m| m != 0) {
                            let b = [bytes[start + 3], bytes[start + 4]];
                            scale = half::f16::from_le_bytes(b).to_f32();
                        }
                    }
                    let got = &out[t * d..(t + 1) * d];
                    assert_eq!(got, &want[..], "{isa}: row {t}, scale bytes {scale_bytes}");
                    assert_eq!(scales[t], scale * 0.5, "{isa}: scale of row {t}");
                }
            }
        }
    }

    /// Rows of every mask length up to 33 bytes (d = 264: whole 64-component chunks and
    /// every tail), random masks, codes that run past `src` at every cut.
    #[test]
    fn placing_long_masks_matches_the_scalar_rule() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for isa in crate::Isa::available() {
            let k = Kernels::new(isa).expect("available");
            for bytes in 1..=33usize {
                for trial in 0..24 {
                    let mask: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
                    let kept: usize = mask.iter().map(|m| m.count_ones() as usize).sum();
                    let at = (next() % 5) as usize;
                    // Full rows, rows cut at a random code, and a source shorter than `at`.
                    let len = match trial % 3 {
                        0 => at + kept + 64,
                        1 => at + (next() as usize % (kept + 1)),
                        _ => at / 2,
                    };
                    let src: Vec<u8> = (0..len).map(|i| (i % 251 + 1) as u8).collect();
                    let mut got = vec![0xa5u8; 8 * bytes];
                    k.place_masked(&mask, &src, at, &mut got);
                    let mut want = vec![0x5au8; 8 * bytes];
                    place_masked(&mask, &src, at, &mut want);
                    assert_eq!(got, want, "{isa}: {bytes} mask bytes, at {at}, src {len}");
                }
            }
        }
    }
    /// Bitmask rows read in place give bit for bit the scores and sums of the same rows
    /// placed first: one and two and three mask words, fp8 and int8 codes, three and four
    /// heads, codes that end exactly at the buffer's end or are cut short by it, and a row
    /// whose mask lies past the buffer.
    #[test]
    fn bitmask_rows_read_in_place_match_placed_rows() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for isa in crate::Isa::available() {
            let k = Kernels::new(isa).expect("available");
            for d in [64usize, 128, 192] {
                if !k.fuses_masked::<I8Codes>(d) {
                    continue;
                }
                for cut in [0usize, 1, 9] {
                    let mut bytes = Vec::new();
                    let mut starts = Vec::new();
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
                        // Codes clear of fp8's NaN patterns (0x7f, 0xff).
                        bytes.extend(
                            (0..kept).map(|_| (next() % 0x7e) as u8 | (next() as u8 & 0x80)),
                        );
                    }
                    bytes.truncate(bytes.len() - cut);
                    starts.push(bytes.len() + 3);
                    let n = starts.len();
                    let mut placed = vec![0u8; n * d];
                    let mut scales = vec![0.0f32; n];
                    k.place_bitmask_rows(&bytes, &starts, d, 2, 0.75, &mut placed, &mut scales);
                    let code_rows: Vec<CodeRow<'_>> = placed
                        .chunks_exact(d)
                        .zip(&scales)
                        .map(|(b, &scale)| CodeRow { bytes: b, scale })
                        .collect();
                    let mut in_place = vec![MaskedRow::EMPTY; n];
                    k.masked_rows(&bytes, &starts, d, 2, 0.75, &mut in_place);
                    for heads in [3usize, 4] {
                        let q: Vec<f32> =
                            (0..heads * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
                        let p: Vec<[f32; 4]> = (0..n)
                            .map(|t| std::array::from_fn(|h| 0.1 + (t * 4 + h) as f32 / 97.0))
                            .collect();
                        let factor = [0.5, 1.0, 0.25, 2.0];
                        let what = format!("{isa} d={d} cut={cut} heads={heads}");
                        fn run<C: Codes>(
                            k: Kernels,
                            args: (&[f32], &[[f32; 4]], [f32; 4], usize),
                            placed: &[CodeRow<'_>],
                            in_place: &[MaskedRow<'_>],
                            what: &str,
                        ) {
                            let (q, p, factor, d) = args;
                            let heads = q.len() / d;
                            let n = placed.len();
                            let (mut a, mut b) = (vec![[0.0f32; 4]; n], vec![[0.0f32; 4]; n]);
                            k.code_scores::<C, 4>(q, d, placed, 0, &mut a);
                            k.masked_scores::<C, 4>(q, d, in_place, 0, &mut b);
                            assert_eq!(a, b, "{what} {:?}: scores", C::KIND);
                            let mut x: Vec<f32> = (0..heads * d).map(|i| i as f32 / 7.0).collect();
                            let mut y = x.clone();
                            k.code_accumulate::<C, 4>(p, placed, 0, &factor, &mut x, d);
                            k.masked_accumulate::<C, 4>(p, in_place, 0, &factor, &mut y, d);
                            assert_eq!(x, y, "{what} {:?}: sums", C::KIND);
                        }
                        let args = (&q[..], &p[..], factor, d);
                        run::<I8Codes>(k, args, &code_rows, &in_place, &what);
                        run::<Fp8Codes>(k, args, &code_rows, &in_place, &what);
                    }
                }
            }
        }
    }
}
