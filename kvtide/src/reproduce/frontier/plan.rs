//! The frontier study's plan: the configurations it runs ([`FrontierRun`]) — the grid of
//! dense and SWAN formats, the equal-footing families, ring, selection, norm and sink
//! variants, and the rotation draws.

use super::*;
use attn_kernels::QueryPrecision;
use models::cache::{ComponentNorm, KeySelect, SwanIndex};
use projection::BasisKind;
use serde::Serializer;

/// Which family of caches a configuration belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// A dense cache (float or quantized rows, optionally rotated and buffered).
    Dense,
    /// A SWAN cache (sparse rows in the calibrated basis behind an f16 buffer).
    Swan,
    /// KIVI (per-channel key groups, per-token value codes) behind an f16 buffer.
    Kivi,
    /// TurboQuant-style codebook rows in a seeded random basis behind an f16 buffer.
    Turbo,
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::Dense => "dense",
            Family::Swan => "swan",
            Family::Kivi => "kivi",
            Family::Turbo => "turbo",
        })
    }
}

/// The code of a configuration's rows: a dense or ring row format, a SWAN value code, or a
/// KIVI / TurboQuant-style code's bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 32-bit floats.
    F32,
    /// 16-bit floats.
    F16,
    /// 8-bit floats (E4M3) with a per-row scale.
    Fp8,
    /// int8 (`q8_0` blocks in dense rows; one scale per row in SWAN rows).
    Int8,
    /// 4-bit (`q4_0` blocks in dense rows; one scale per row in SWAN rows).
    Int4,
    /// A KIVI or TurboQuant-style code of this many bits per element.
    Bits(u8),
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Code::F32 => f.write_str("f32"),
            Code::F16 => f.write_str("f16"),
            Code::Fp8 => f.write_str("fp8"),
            Code::Int8 => f.write_str("int8"),
            Code::Int4 => f.write_str("int4"),
            Code::Bits(b) => write!(f, "{b}"),
        }
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Serializes a value by its spec name.
fn by_name<T: std::fmt::Display, S: Serializer>(
    v: &T,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Serializes an optional value by its spec name (`null` when unset).
fn opt_by_name<T: std::fmt::Display, S: Serializer>(
    v: &Option<T>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Serializes a rotation as `rotate=` names it (`none` when unrotated).
fn rotation_name<S: Serializer>(
    v: &Option<BasisKind>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.collect_str(&RotationName(*v))
}

/// Serializes a SWAN index code by name (`—` for a configuration without one).
fn index_name<S: Serializer>(v: &Option<SwanIndex>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match v {
        Some(i) => s.collect_str(i),
        None => s.serialize_str("—"),
    }
}

/// A rotation as `rotate=` writes it: the basis, or `none`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RotationName(pub Option<BasisKind>);

impl std::fmt::Display for RotationName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(b) => write!(f, "{b}"),
            None => f.write_str("none"),
        }
    }
}

/// One configuration of the study.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FrontierRun {
    /// The cache family.
    pub family: Family,
    /// Dense storage (f16, fp8, int8, int4; a quantized cache's key rows when `value_rows`
    /// is set), SWAN value code, or a KIVI / TurboQuant-style code's bits.
    pub values: Code,
    /// A dense quantized configuration's value rows when their format is not the key rows'
    /// (`values=`; llama.cpp's `-ctv` beside its `-ctk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_rows: Option<Code>,
    /// Rotation of a dense or coded cache (`None`: unrotated); SWAN: its basis.
    #[serde(serialize_with = "rotation_name")]
    pub rotate: Option<BasisKind>,
    /// SWAN index code; `None` for the other families.
    #[serde(serialize_with = "index_name")]
    pub index: Option<SwanIndex>,
    /// Kept components per sparse row (SWAN; the key rows').
    pub k: Option<usize>,
    /// Kept components per sparse value row when they differ from `k` (a SWAN split of the
    /// same bytes between keys and values).
    pub kv: Option<usize>,
    /// Recent-token buffer rows `b`, kept exact in f16 (SWAN's dense buffer; a quantized
    /// dense configuration's buffer of the same kind: `dense:…,b=N`).
    pub buffer: usize,
    /// Query precision of the score products ([`QueryPrecision::F32`];
    /// [`QueryPrecision::Int8`]: the queries rounded to int8 per head and step against int8
    /// keys; [`QueryPrecision::Q8Blocks`]: rounded to `q8_0` blocks against keys of any
    /// format — as llama.cpp's CPU flash attention rounds them for `q8_0`/`q4_0` caches).
    #[serde(serialize_with = "by_name")]
    pub queries: QueryPrecision,
    /// Format of the local layers' rings on a sliding-window model when it is not the
    /// spec's default (a dense configuration's own format, a SWAN configuration's f16
    /// buffer format): int8 (`q8_0` blocks) for a SWAN configuration.
    pub ring: Option<Code>,
    /// The rings' value rows when their format is not the key rows' [`FrontierRun::ring`]
    /// (`ring_values=`): int4 beside int8 rings — llama.cpp's `-ctk q8_0 -ctv q4_0` on the
    /// local layers, as the dense mixed rows keep them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring_values: Option<Code>,
    /// The rings' own basis when it is not the spec's (`ring_rotate=`): `hadamard-v` for
    /// int4 rings — values in Walsh–Hadamard blocks, keys unrotated — as 4-bit codes
    /// collapse in the calibrated basis.
    #[serde(serialize_with = "opt_by_name")]
    pub ring_rotate: Option<BasisKind>,
    /// SWAN key selection when it is not the paper's magnitude rule: [`KeySelect::Query`]
    /// (magnitude weighted by the queries' RMS along each basis vector, `select=query`).
    #[serde(serialize_with = "opt_by_name")]
    pub select: Option<KeySelect>,
    /// SWAN component scaling when not the paper's unscaled rows: [`ComponentNorm::Eigen`]
    /// (each basis component divided by a power of two from its calibrated energy before
    /// storage, `norm=eigen`).
    #[serde(serialize_with = "opt_by_name")]
    pub norm: Option<ComponentNorm>,
    /// Positions kept in `f32` (`sink=`; `0`: none) — the attention sink, whose rounding
    /// every query shares: a quantized dense cache's before its quantized rows, a SWAN
    /// cache's beside its buffer (never evicted), and quantized rings' while in the window.
    pub sink: usize,
}

impl FrontierRun {
    /// A dense configuration: `values` rows (keys and values) in the `rotate` basis, f32
    /// queries, no buffer, no sink.
    pub fn dense(values: Code, rotate: Option<BasisKind>) -> Self {
        Self {
            family: Family::Dense,
            values,
            value_rows: None,
            rotate,
            index: None,
            k: None,
            kv: None,
            buffer: 0,
            queries: QueryPrecision::F32,
            ring: None,
            ring_values: None,
            ring_rotate: None,
            select: None,
            norm: None,
            sink: 0,
        }
    }

    /// The same dense configuration with its value rows in `values` (keys stay as they
    /// are: llama.cpp's `-ctk K -ctv V`).
    pub fn with_value_rows(self, values: Code) -> Self {
        Self { value_rows: Some(values), ..self }
    }

    /// The same dense configuration with its `b` newest positions kept in f16 (`b=N`): the
    /// buffer SWAN's rows keep, for a comparison on equal footing.
    pub fn buffered(self, b: usize) -> Self {
        Self { buffer: b, ..self }
    }

    /// A KIVI configuration at `bits` (2 or 4), groups of 32, behind `b` buffered positions.
    pub fn kivi(bits: u8, b: usize) -> Self {
        Self { family: Family::Kivi, buffer: b, ..Self::dense(Code::Bits(bits), None) }
    }

    /// A TurboQuant-style configuration at `bits` (2, 3 or 4) in the seeded random basis 0,
    /// behind `b` buffered positions.
    pub fn turbo(bits: u8, b: usize) -> Self {
        let rotate = Some(BasisKind::Random { seed: 0 });
        Self { family: Family::Turbo, buffer: b, ..Self::dense(Code::Bits(bits), rotate) }
    }

    /// Whether this is a KIVI or TurboQuant-style configuration (`values` holds its bits).
    pub fn is_coded(&self) -> bool {
        matches!(self.family, Family::Kivi | Family::Turbo)
    }

    /// Whether this is a quantized dense configuration of the equal-footing grid: one
    /// format for keys and values, f32 queries, no sink, and the spec's own rings or the f16
    /// rings every configuration keeps on equal footing.
    pub fn is_plain_quantized(&self) -> bool {
        self.family == Family::Dense
            && self.values != Code::F16
            && self.value_rows.is_none()
            && self.queries == QueryPrecision::F32
            && self.sink == 0
            && matches!(self.ring, None | Some(Code::F16))
            && self.ring_values.is_none()
            && !self.is_rotation_draw()
    }

    /// The same configuration keeping its first position in `f32` (`sink=1`).
    pub fn with_sink(self) -> Self {
        Self { sink: 1, ..self }
    }

    /// A SWAN configuration: `index` rows of `values` codes keeping `k` components of each
    /// key and value row, in the calibrated basis behind `buffer` f16 rows.
    pub fn swan(index: SwanIndex, values: Code, k: usize, buffer: usize) -> Self {
        let dense = Self::dense(values, Some(BasisKind::Calibrated));
        Self { family: Family::Swan, index: Some(index), k: Some(k), buffer, ..dense }
    }

    /// The same SWAN configuration keeping `k` components of each key row and `kv` of each
    /// value row.
    pub fn split(self, k: usize, kv: usize) -> Self {
        Self { k: Some(k), kv: (kv != k).then_some(kv), ..self }
    }

    /// The same SWAN configuration with the local layers' rings in int8 (`q8_0` blocks)
    /// instead of its f16 buffer format.
    pub fn with_int8_ring(self) -> Self {
        Self { ring: Some(Code::Int8), ..self }
    }

    /// The same SWAN configuration with the local layers' rings in int4 (`q4_0` blocks),
    /// their values in Walsh–Hadamard blocks and keys unrotated (`ring_rotate=hadamard-v`).
    pub fn with_int4_ring(self) -> Self {
        Self { ring: Some(Code::Int4), ring_rotate: Some(BasisKind::HadamardValues), ..self }
    }

    /// The same SWAN configuration with the local layers' rings as int8 keys and int4
    /// values (`q8_0` / `q4_0` blocks), the values in Walsh–Hadamard blocks and the keys
    /// unrotated (`ring_rotate=hadamard-v`): the rings of the dense int8/int4 rows.
    pub fn with_mixed_ring(self) -> Self {
        let ring_rotate = Some(BasisKind::HadamardValues);
        Self { ring: Some(Code::Int8), ring_values: Some(Code::Int4), ring_rotate, ..self }
    }

    /// The same SWAN configuration selecting keys by query-weighted magnitude.
    pub fn with_query_select(self) -> Self {
        Self { select: Some(KeySelect::Query), ..self }
    }

    /// The same SWAN configuration storing components scaled by the basis' eigenvalues.
    pub fn with_eigen_norm(self) -> Self {
        Self { norm: Some(ComponentNorm::Eigen), ..self }
    }

    /// The component scaling ([`ComponentNorm::None`] unless set).
    pub fn norm_rule(&self) -> ComponentNorm {
        self.norm.unwrap_or_default()
    }

    /// The key selection ([`KeySelect::Magnitude`] unless set).
    pub fn select_rule(&self) -> KeySelect {
        self.select.unwrap_or_default()
    }

    /// The rotation as `rotate=` names it.
    pub fn rotation(&self) -> RotationName {
        RotationName(self.rotate)
    }

    /// The ring format (a SWAN or coded configuration's default: f16; a dense
    /// configuration's own — the key rows' when the value rows differ).
    pub fn ring_format(&self) -> Code {
        self.ring.unwrap_or(if self.k.is_some() || self.is_coded() {
            Code::F16
        } else {
            self.values
        })
    }

    /// The rings' formats as `--frontier-rings` names them: [`FrontierRun::ring_format`],
    /// with `/` and the value rows' format when theirs differs (`int8/int4`).
    pub fn ring_formats(&self) -> String {
        match self.ring_value_rows() {
            Some(v) => format!("{}/{v}", self.ring_format()),
            None => self.ring_format().to_string(),
        }
    }

    /// The rings' value rows when their format is not [`FrontierRun::ring_format`]: a ring
    /// of its own takes `ring_values`; a dense configuration's rings follow both its formats.
    pub(super) fn ring_value_rows(&self) -> Option<Code> {
        match self.ring {
            Some(_) => self.ring_values,
            None if self.k.is_none() => self.value_rows,
            None => None,
        }
    }

    /// The same configuration with int8 queries.
    pub fn with_int8_queries(self) -> Self {
        Self { queries: QueryPrecision::Int8, ..self }
    }

    /// The same configuration with its queries rounded to `q8_0` blocks.
    pub fn with_q8_0_queries(self) -> Self {
        Self { queries: QueryPrecision::Q8Blocks, ..self }
    }

    /// Whether this is the counterpart of one of llama.cpp's KV types (dense f16, Hadamard
    /// int8 or int4).
    pub fn is_llamacpp_counterpart(&self) -> bool {
        LLAMACPP_COUNTERPARTS.iter().any(|(_, l)| *l == self.label())
    }

    /// The family of [`add_rotation_draws`]' row this is — dense int4 (keys and values) in
    /// one of the family's seeded bases — or `None` for any other row.
    pub fn rotation_draw(&self) -> Option<DrawFamily> {
        let plain = self.family == Family::Dense
            && self.values == Code::Int4
            && self.value_rows.is_none()
            && self.sink == 0;
        let drawn = |f: &DrawFamily| self.rotate.is_some_and(|b| f.bases().contains(&b));
        DrawFamily::ALL.into_iter().find(|f| plain && drawn(f))
    }

    /// Whether this is one of [`add_rotation_draws`]' rows, of either family.
    pub fn is_rotation_draw(&self) -> bool {
        self.rotation_draw().is_some()
    }

    /// A short label.
    pub fn label(&self) -> String {
        let queries = if self.queries == QueryPrecision::F32 {
            String::new()
        } else {
            format!(" queries={}", self.queries)
        };
        let ring = self.ring.map_or(String::new(), |r| format!(" ring={r}"));
        let ring = match self.ring_values {
            Some(v) => format!("{ring} ring_values={v}"),
            None => ring,
        };
        let ring = match self.ring_rotate {
            Some(b) => format!("{ring} ring_rotate={b}"),
            None => ring,
        };
        let select = self.select.map_or(String::new(), |s| format!(" select={s}"));
        let norm = self.norm.map_or(String::new(), |n| format!(" norm={n}"));
        let sink = if self.sink > 0 { format!(" sink={}", self.sink) } else { String::new() };
        let tail = format!("{sink}{ring}{select}{norm}{queries}");
        let v = self.value_rows.map_or(String::new(), |v| format!(" values={v}"));
        let b = if self.buffer > 0 { format!(" b={}", self.buffer) } else { String::new() };
        let index = self.index.unwrap_or_default();
        match (self.family, self.k) {
            (Family::Kivi, _) => format!("kivi{}{b}{tail}", self.values),
            (Family::Turbo, _) => {
                format!("turbo{} rotate={}{b}{tail}", self.values, self.rotation())
            }
            (_, None) if self.rotate.is_none() => format!("dense {}{v}{b}{tail}", self.values),
            (_, None) => format!("dense {}{v} rotate={}{b}{tail}", self.values, self.rotation()),
            (_, Some(k)) => {
                let kv = self.kv.map_or(String::new(), |kv| format!("/{kv}"));
                format!("swan {index} {} k={k}{kv} b={}{tail}", self.values, self.buffer)
            }
        }
    }

    /// The cache spec (`proj` = the calibrated projection file).
    pub fn spec(&self, proj: &str, threads: usize) -> String {
        let queries = if self.queries == QueryPrecision::F32 {
            String::new()
        } else {
            format!(",queries={}", self.queries)
        };
        let ring = self.ring.map_or(String::new(), |r| format!(",ring={r}"));
        let ring = match self.ring_values {
            Some(v) => format!("{ring},ring_values={v}"),
            None => ring,
        };
        let ring = match self.ring_rotate {
            Some(b) => format!("{ring},ring_rotate={b}"),
            None => ring,
        };
        let select = self.select.map_or(String::new(), |s| format!(",select={s}"));
        let norm = self.norm.map_or(String::new(), |n| format!(",norm={n}"));
        let sink = if self.sink > 0 { format!(",sink={}", self.sink) } else { String::new() };
        let spec = match self.k {
            None if self.is_coded() => format!(
                "{}:bits={},rotate={},b={}{sink},threads={threads}",
                self.family,
                self.values,
                self.rotation(),
                self.buffer
            ),
            None => {
                let p = if self.rotate == Some(BasisKind::Calibrated) {
                    format!(",proj={proj}")
                } else {
                    String::new()
                };
                let v = self.value_rows.map_or(String::new(), |v| format!(",values={v}"));
                let b = if self.buffer > 0 { format!(",b={}", self.buffer) } else { String::new() };
                format!(
                    "dense:format={}{v},rotate={}{p}{sink}{b},threads={threads}",
                    self.values,
                    self.rotation()
                )
            }
            Some(k) => format!(
                "swan:k={k},kv={},b={},index={},value={},buffer=f16,basis=calibrated,proj={proj}{sink},threads={threads}",
                self.kv.unwrap_or(k),
                self.buffer,
                self.index.unwrap_or_default(),
                self.values
            ),
        };
        spec + &ring + &select + &norm + &queries
    }

    /// Bytes one (layer, kv-head) holds for `tokens` tokens, from the formulas: dense rows,
    /// or `min(n, b)` f16 buffer rows plus `n − b` sparse rows (key and value, each
    /// `index + values + scale + 2` bytes) plus an 8-byte base per block of sparse rows.
    pub fn head_bytes(&self, d: usize, tokens: usize) -> usize {
        use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks};
        if self.is_coded() {
            return self.coded_head_bytes(d, tokens);
        }
        let Some(k) = self.k else {
            let row = |format: Code| match format {
                Code::Fp8 => Fp8Rows::row_bytes(d),
                Code::Int8 => Int8Blocks::row_bytes(d),
                Code::Int4 => Int4Blocks::row_bytes(d),
                Code::F32 => 4 * d,
                Code::F16 | Code::Bits(_) => 2 * d,
            };
            // A key row and a value row, each in its own format.
            let token = row(self.values) + row(self.value_rows.unwrap_or(self.values));
            // Sink positions are kept in f32 in place of their quantized rows, the newest
            // `b` after them in the f16 buffer.
            let sink = tokens.min(self.sink);
            let buffered = (tokens - sink).min(self.buffer);
            return (tokens - sink - buffered) * token + 2 * sink * 4 * d + buffered * 2 * 2 * d;
        };
        let cfg = self.swan_config(d, k, self.kv.unwrap_or(k));
        // Sink positions are kept in f32 and never reach the buffer or the sparse rows.
        let sink = tokens.min(self.sink);
        let tokens = tokens - sink;
        let sparse = tokens.saturating_sub(self.buffer);
        // Blocks of rows keep u16 offsets: a u8-list row of 16- or 8-bit floats lives in a
        // CSR store (at most 65 535 entries a block), every other encoding in a coded store
        // (at most 65 535 bytes of full rows a block).
        let elems = matches!(self.values, Code::F16 | Code::Fp8 | Code::F32);
        let rows_per_block = if self.index == Some(SwanIndex::List) && elems {
            kv_sparse::csr::max_rows_per_block(d).min(256)
        } else {
            let full = self.swan_config(d, d, d).sparse_token_bytes(d) / 2 - 2;
            (u16::MAX as usize / full).min(256)
        };
        let blocks = 2 * sparse.div_ceil(rows_per_block);
        2 * sink * 4 * d
            + 2 * tokens.min(self.buffer) * 2 * d
            + sparse * cfg.sparse_token_bytes(d)
            + 8 * blocks
    }

    /// [`FrontierRun::head_bytes`] of a KIVI or TurboQuant-style configuration: f32 sink rows,
    /// `b` f16 buffer rows, then the codes — KIVI keys in complete groups of 32 tokens (codes
    /// plus an f16 scale and zero per channel), the incomplete group's keys in f16, KIVI values
    /// with an f16 scale and zero per 32 channels; TurboQuant-style rows an f16 norm each.
    pub(super) fn coded_head_bytes(&self, d: usize, tokens: usize) -> usize {
        let bits = match self.values {
            Code::Bits(b) => usize::from(b),
            _ => 4,
        };
        let codes = kv_sparse::decoded::packed_bytes(d, bits);
        let sink = tokens.min(self.sink);
        let buffered = (tokens - sink).min(self.buffer);
        let h = tokens - sink - buffered;
        let history = if self.family == Family::Kivi {
            const G: usize = 32;
            let keys = h / G * (4 * d + G * codes) + h % G * 2 * d;
            keys + h * (4 * d / G + codes)
        } else {
            h * 2 * (2 + codes)
        };
        2 * sink * 4 * d + buffered * 2 * 2 * d + history
    }

    /// Bytes of one position's key and value in a local layer's ring (per kv-head): a dense
    /// configuration's own rows (the spec's ring follows its format), a SWAN
    /// configuration's f16 buffer rows or, with an `int8` ring, `q8_0` rows: one dense row
    /// of [`FrontierRun::ring_format`] each (the value row in `ring_values` when set).
    pub fn ring_token_bytes(&self, d: usize) -> usize {
        let mut ring = FrontierRun::dense(self.ring_format(), None);
        ring.value_rows = self.ring_value_rows();
        ring.head_bytes(d, 1)
    }

    pub(super) fn swan_config(&self, d: usize, k: usize, kv: usize) -> models::cache::SwanConfig {
        use kv_sparse::ValueFormat;
        use kv_sparse::coded::ValueKind;
        let mut c = models::cache::SwanConfig::lossless(d, self.buffer);
        c.k_key = k;
        c.k_value = kv;
        c.index = self.index.unwrap_or_default();
        c.value = match self.values {
            Code::Int8 => ValueKind::Int8,
            Code::Int4 => ValueKind::Int4,
            Code::Fp8 => ValueKind::Elems(ValueFormat::Fp8E4M3),
            Code::F32 => ValueKind::Elems(ValueFormat::F32),
            Code::F16 | Code::Bits(_) => ValueKind::Elems(ValueFormat::F16),
        };
        c
    }
}

/// Adds to `runs` the `twin` of each configuration `keep` selects, unless already there.
pub(super) fn add_twins(
    runs: &mut Vec<FrontierRun>,
    keep: impl Fn(&&FrontierRun) -> bool,
    twin: impl Fn(FrontierRun) -> FrontierRun,
) {
    let more: Vec<FrontierRun> =
        runs.iter().filter(keep).map(|r| twin(r.clone())).filter(|r| !runs.contains(r)).collect();
    runs.extend(more);
}

/// Adds to `runs`, for a model with sliding-window layers, each SWAN configuration with
/// 8-bit values (fp8, int8) once more with `int8` local rings: the rings are most of a
/// windowed model's cache at a few thousand tokens, and a dense quantized configuration
/// quantizes them too. Configurations already there are not added twice.
pub fn add_int8_rings(runs: &mut Vec<FrontierRun>) {
    add_twins(
        runs,
        |r| r.k.is_some() && r.ring.is_none() && matches!(r.values, Code::Fp8 | Code::Int8),
        FrontierRun::with_int8_ring,
    );
}

/// Adds to `runs` each bitmask SWAN configuration with int8 values, one budget for keys and
/// values, the paper's key selection and f16 rings once more with `int4` rings in
/// Walsh–Hadamard coordinates ([`FrontierRun::ring_rotate`]): at the end of a short window
/// the rings are most of a windowed model's bytes, and below ~0.38 × f16 only 4-bit rings
/// leave the global layers any bytes. Configurations already there are not added twice.
pub fn add_int4_rings(runs: &mut Vec<FrontierRun>) {
    add_twins(
        runs,
        |r| {
            r.k.is_some()
                && r.kv.is_none()
                && r.ring.is_none()
                && r.select.is_none()
                && r.index == Some(SwanIndex::Bitmask)
                && r.values == Code::Int8
        },
        FrontierRun::with_int4_ring,
    );
}

/// Adds to `runs` each bitmask SWAN configuration with int8 values, one budget for keys and
/// values and `int8` rings once more with the rings' value rows in `int4` (in
/// Walsh–Hadamard blocks, keys unrotated: [`FrontierRun::ring_values`]) — the rings the dense
/// int8/int4 rows keep: at the end of a short window the rings are most of a windowed
/// model's bytes. Configurations already there are not added twice.
pub fn add_mixed_rings(runs: &mut Vec<FrontierRun>) {
    add_twins(
        runs,
        |r| {
            r.k.is_some()
                && r.kv.is_none()
                && r.ring == Some(Code::Int8)
                && r.ring_values.is_none()
                && r.index == Some(SwanIndex::Bitmask)
                && r.values == Code::Int8
        },
        FrontierRun::with_mixed_ring,
    );
}

/// Adds to `runs` each bitmask SWAN configuration with 8-bit values (fp8, int8) and equal
/// key and value budgets once more with `select=query`: keys pruned by magnitude weighted
/// with the queries' RMS along each basis vector instead of magnitude alone. Whether that
/// helps is a property of the model (the study measures it per model); configurations
/// already there are not added twice.
pub fn add_query_selection(runs: &mut Vec<FrontierRun>) {
    add_twins(
        runs,
        |r| {
            r.k.is_some()
                && r.kv.is_none()
                && r.select.is_none()
                && r.index == Some(SwanIndex::Bitmask)
                && matches!(r.values, Code::Fp8 | Code::Int8)
        },
        FrontierRun::with_query_select,
    );
}

/// Adds to `runs` each SWAN configuration with integer values (int8, int4: one scale per
/// row) once more with `norm=eigen`: the components divided by powers of two from the
/// calibrated energies before storage, so that the row's one scale fits the small components
/// as well as the large. Same bytes; float codes (f16, fp8) keep their relative precision
/// whatever the scale, so they are not repeated. Configurations already there are not added
/// twice.
pub fn add_component_norm(runs: &mut Vec<FrontierRun>) {
    add_twins(
        runs,
        |r| r.k.is_some() && r.norm.is_none() && matches!(r.values, Code::Int8 | Code::Int4),
        FrontierRun::with_eigen_norm,
    );
}

/// Adds to `runs` each SWAN configuration with integer bitmask rows (int8, int4), one
/// budget for keys and values and the paper's key selection once more keeping its first
/// position in `f32` (`sink=1`; in its quantized rings too): the rows that compete with a
/// dense quantized cache, which keeps the attention sink so. On a model with
/// sliding-window layers, those with quantized rings: `int4` rings, and `int8` rings
/// (mixed or not) under either key selection — the rows that compete with the dense rows at
/// 0.4–0.5 × f16. Configurations already there are not added twice.
pub fn add_sinks(runs: &mut Vec<FrontierRun>, windowed: bool) {
    add_twins(
        runs,
        |r| {
            r.k.is_some()
                && r.kv.is_none()
                && r.sink == 0
                && r.index == Some(SwanIndex::Bitmask)
                && matches!(r.values, Code::Int8 | Code::Int4)
                && match (windowed, r.ring) {
                    (false, _) | (true, Some(Code::Int4)) => r.select.is_none(),
                    (true, ring) => ring == Some(Code::Int8),
                }
        },
        FrontierRun::with_sink,
    );
}

/// Which seeded bases the int4 rotation draws are taken from (`--frontier-draw-bases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum DrawFamily {
    /// Haar-random orthogonal bases (`rotate=random:SEED`).
    Random,
    /// The Walsh–Hadamard matrices llama.cpp rotates by, with seeded random row signs
    /// (`rotate=hadamard-signs:SEED`, [`BasisKind::SignedHadamard`]).
    HadamardSigns,
    /// llama.cpp's key rotation kept exactly, its value blocks with seeded random row signs
    /// (`rotate=hadamard-value-signs:SEED`, [`BasisKind::SignedHadamardValues`]): the
    /// same 4-bit keys in the first layer, another rounding of every value row, so their
    /// spread is how far a change of the value rounding alone moves the 4-bit cost — what
    /// llama.cpp's own value types do to its q4_0 keys' cost.
    HadamardValueSigns,
    /// llama.cpp's Walsh–Hadamard matrices turned by `10⁻⁵` rad in random planes
    /// (`rotate=hadamard-jitter:SEED`, [`BasisKind::HadamardJitter`]): the same
    /// rotation up to float-rounding-sized differences, so their spread is how far such
    /// differences alone (another tool's summation order) move the 4-bit cost.
    HadamardJitter,
}

impl DrawFamily {
    /// Every family, in report order.
    pub const ALL: [DrawFamily; 4] = [
        DrawFamily::Random,
        DrawFamily::HadamardSigns,
        DrawFamily::HadamardValueSigns,
        DrawFamily::HadamardJitter,
    ];

    /// The family's basis of `seed`.
    pub const fn basis(self, seed: u64) -> BasisKind {
        match self {
            DrawFamily::Random => BasisKind::Random { seed },
            DrawFamily::HadamardSigns => BasisKind::SignedHadamard { seed },
            DrawFamily::HadamardValueSigns => BasisKind::SignedHadamardValues { seed },
            DrawFamily::HadamardJitter => BasisKind::HadamardJitter { seed },
        }
    }

    /// The family's bases, seeds 1 to 8.
    pub fn bases(self) -> [BasisKind; 8] {
        std::array::from_fn(|i| self.basis(i as u64 + 1))
    }

    /// What a report calls the family's bases.
    pub const fn describe(self) -> &'static str {
        match self {
            DrawFamily::Random => "random orthogonal bases",
            DrawFamily::HadamardSigns => "sign-randomized Hadamard bases",
            DrawFamily::HadamardValueSigns => "Hadamard keys with sign-randomized value blocks",
            DrawFamily::HadamardJitter => "Hadamard bases turned by 1e-5 rad",
        }
    }
}

/// Adds dense int4 (`q4_0` keys and values) in the first `n` (at most 8) of `family`'s
/// seeded bases. A random orthogonal basis spreads a head's outliers as the Walsh–Hadamard
/// matrix does, so no draw is better than another in expectation; what their costs spread
/// over is the resolution at which two single draws — kvtide's Hadamard int4 and llama.cpp's
/// `q4_0`, each one fixed rounding of the positions every window shares — can be told
/// apart. The sign-randomized Hadamard draws keep the matrix's structure and redraw only its
/// sign pattern: where the plain matrix falls among them says whether its cost is the
/// structure's or one pattern's. The jittered draws are the plain matrices up to
/// rounding-sized turns: their spread is the cost's numerical resolution — how far two
/// correct implementations of the same cache may land apart. Measured under llama.cpp's
/// condition beside the counterparts.
pub fn add_rotation_draws(runs: &mut Vec<FrontierRun>, family: DrawFamily, n: usize) {
    for rotate in family.bases().into_iter().take(n) {
        let run = FrontierRun::dense(Code::Int4, Some(rotate));
        if !runs.contains(&run) {
            runs.push(run);
        }
    }
}

/// The grid of a plan size: `swan_k` as fractions of `d_h` in eighths, `buffers` for SWAN.
pub fn grid(head_dim: usize, swan_k: &[usize], buffers: &[usize], full: bool) -> Vec<FrontierRun> {
    use BasisKind::{Calibrated, Hadamard, HadamardValues};
    let mut runs = vec![FrontierRun::dense(Code::F16, None)];
    let rotations: &[Option<BasisKind>] = if full {
        &[None, Some(Hadamard), Some(HadamardValues), Some(Calibrated)]
    } else {
        &[None, Some(Hadamard)]
    };
    // Every quantized format unbuffered (llama.cpp's condition) and behind each of the SWAN
    // grid's buffers: SWAN and the dense formats compared on equal footing.
    for b in std::iter::once(0).chain(buffers.iter().copied().filter(|&b| b > 0)) {
        for values in [Code::Fp8, Code::Int8, Code::Int4] {
            for &rotate in rotations {
                runs.push(FrontierRun::dense(values, rotate).buffered(b));
            }
        }
    }
    // llama.cpp's q8_0 cache as it scores it, with the queries rounded to int8 (where this
    // CPU has the integer products).
    if attn_kernels::QueryPrecision::Int8.is_available() {
        runs.push(FrontierRun::dense(Code::Int8, Some(Hadamard)).with_int8_queries());
    }
    // llama.cpp's q4_0 cache as its CPU flash attention scores it: the queries rounded to
    // q8_0 blocks, the keys' q4_0 codes in f32 products.
    runs.push(FrontierRun::dense(Code::Int4, Some(Hadamard)).with_q8_0_queries());
    // The rotated 4- and 8-bit caches with the attention sink kept in f32: the one row whose
    // rounding error every query and every window shares.
    for (values, rotate) in
        [(Code::Int8, Hadamard), (Code::Int4, Hadamard), (Code::Int4, HadamardValues)]
    {
        runs.push(FrontierRun::dense(values, Some(rotate)).with_sink());
    }
    // Keys and values in different formats, as llama.cpp's `-ctk/-ctv` pairs them: 8-bit
    // keys (whose rounding every score sees) with 4-bit values — a common setting — and the
    // reverse, which mirrors llama.cpp's 4-bit keys with 8-bit values.
    for &rotate in rotations {
        runs.push(FrontierRun::dense(Code::Int8, rotate).with_value_rows(Code::Int4));
    }
    let hadamard = |values| FrontierRun::dense(values, Some(Hadamard));
    runs.push(hadamard(Code::Int8).with_value_rows(Code::Int4).with_sink());
    runs.push(hadamard(Code::Int4).with_value_rows(Code::Int8));
    let values: &[Code] = if full {
        &[Code::F16, Code::Fp8, Code::Int8, Code::Int4]
    } else {
        &[Code::Fp8, Code::Int8, Code::Int4]
    };
    for index in [SwanIndex::List, SwanIndex::Bitmask] {
        for &v in values {
            for &eighths in swan_k {
                for &b in buffers {
                    runs.push(FrontierRun::swan(index, v, head_dim * eighths / 8, b));
                }
            }
        }
    }
    // The bytes of k = d_h/2 split unevenly between key and value rows (keys 5/8 or 6/8 of
    // d_h, or 3/8): which half a model's attention needs more of (the paper's K/V
    // ablation), at the operating point of the bitmask target.
    if full {
        let e = head_dim / 8;
        for v in [Code::Fp8, Code::Int8] {
            for &b in buffers {
                for (k, kv) in [(5 * e, 3 * e), (6 * e, 2 * e), (3 * e, 5 * e)] {
                    runs.push(FrontierRun::swan(SwanIndex::Bitmask, v, k, b).split(k, kv));
                }
            }
        }
    }
    runs
}

/// A restriction of the plan's SWAN grid (`kvtide reproduce --frontier-k-eighths …`): the
/// axes of a multi-hour grid a run may narrow to fit its time, on the plan's windows. Empty
/// lists keep an axis whole; the dense rows are always kept.
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct SwanGrid {
    /// Only these kept-component counts in the frontier's SWAN grid, in eighths of `d_h`
    /// (1 = `d_h`/8 … 8 = `d_h`; comma-separated).
    #[arg(
        long = "frontier-k-eighths",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub k_eighths: Vec<usize>,
    /// Only these dense-buffer sizes `b` in the frontier's SWAN grid (comma-separated).
    #[arg(
        long = "frontier-buffers",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub buffers: Vec<usize>,
    /// Only these SWAN value codes (comma-separated: f16, fp8, int8, int4).
    #[arg(
        long = "frontier-values",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub values: Vec<String>,
    /// Only these formats of a sliding-window model's local rings (comma-separated: f16,
    /// int8, int4, or keys/values such as int8/int4).
    #[arg(
        long = "frontier-rings",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub rings: Vec<String>,
    /// Only these key selections (comma-separated: magnitude, query).
    #[arg(
        long = "frontier-select",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub select: Vec<String>,
    /// Only these component scalings (comma-separated: none, eigen).
    #[arg(
        long = "frontier-norm",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub norm: Vec<String>,
    /// Only these sink sizes (comma-separated positions kept in `f32`: 0, 1).
    #[arg(
        long = "frontier-sinks",
        value_delimiter = ',',
        conflicts_with = "frontier_external_only"
    )]
    pub sinks: Vec<usize>,
}

impl SwanGrid {
    /// Whether every axis is whole.
    pub fn is_whole(&self) -> bool {
        self.k_eighths.is_empty()
            && self.buffers.is_empty()
            && self.values.is_empty()
            && self.rings.is_empty()
            && self.select.is_empty()
            && self.norm.is_empty()
            && self.sinks.is_empty()
    }

    /// Keeps the dense runs of `runs` and the SWAN runs on every restricted axis.
    ///
    /// # Errors
    /// [`crate::Error::InvalidInput`] when a listed value names no SWAN run of the plan
    /// (e.g. a buffer the grid does not have), or nothing of the SWAN grid is left.
    pub fn apply(&self, runs: &mut Vec<FrontierRun>, head_dim: usize) -> Result<()> {
        const OP: &str = "reproduce --frontier-k-eighths/--frontier-buffers/--frontier-values/\
                          --frontier-rings/--frontier-select/--frontier-norm/--frontier-sinks";
        let eighths =
            |r: &FrontierRun| r.k.filter(|k| k * 8 % head_dim == 0).map(|k| k * 8 / head_dim);
        let strings = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>();
        // Each axis: its name, the listed values, and a SWAN run's value on it.
        type Value<'a> = &'a dyn Fn(&FrontierRun) -> Option<String>;
        let axes: [(&str, Vec<String>, Value<'_>); 7] = [
            ("k eighths", strings(&self.k_eighths), &|r| eighths(r).map(|e| e.to_string())),
            ("buffers", strings(&self.buffers), &|r| Some(r.buffer.to_string())),
            ("values", self.values.clone(), &|r| Some(r.values.to_string())),
            ("rings", self.rings.clone(), &|r| Some(r.ring_formats())),
            ("key selections", self.select.clone(), &|r| Some(r.select_rule().to_string())),
            ("component scalings", self.norm.clone(), &|r| Some(r.norm_rule().to_string())),
            ("sinks", strings(&self.sinks), &|r| Some(r.sink.to_string())),
        ];
        for (what, listed, value) in &axes {
            let mut has: Vec<String> =
                runs.iter().filter(|r| r.k.is_some()).filter_map(value).collect();
            has.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
            has.dedup();
            let missing: Vec<&str> =
                listed.iter().filter(|l| !has.contains(l)).map(String::as_str).collect();
            if !missing.is_empty() {
                return Err(invalid(
                    OP,
                    format!(
                        "{what} {} not in this plan's SWAN grid (it has {})",
                        missing.join(", "),
                        has.join(", ")
                    ),
                ));
            }
        }
        // The buffers axis holds for the buffered dense rows too (b = 0, llama.cpp's
        // condition, always stays).
        let dense_kept = |r: &FrontierRun| {
            r.buffer == 0 || self.buffers.is_empty() || self.buffers.contains(&r.buffer)
        };
        runs.retain(|r| {
            (r.k.is_none() && dense_kept(r))
                || axes.iter().all(|(_, listed, value)| {
                    listed.is_empty() || value(r).is_some_and(|v| listed.contains(&v))
                })
        });
        if !runs.iter().any(|r| r.k.is_some()) {
            return Err(invalid(OP, "no SWAN configuration of the plan is on every listed axis"));
        }
        Ok(())
    }

    /// A line for the log and the report saying how the grid was restricted.
    pub fn describe(&self) -> String {
        let list = |v: Vec<String>| if v.is_empty() { "all".to_owned() } else { v.join(", ") };
        format!(
            "SWAN grid restricted to k = {} eighths of d_h, b = {}, values {}, rings {}, key \
             selection {}, component scaling {}, sink {}",
            list(self.k_eighths.iter().map(usize::to_string).collect()),
            list(self.buffers.iter().map(usize::to_string).collect()),
            list(self.values.clone()),
            list(self.rings.clone()),
            list(self.select.clone()),
            list(self.norm.clone()),
            list(self.sinks.iter().map(usize::to_string).collect()),
        )
    }
}

/// Narrows `runs` to the equal-footing comparison and adds the published quantizers: dense
/// f16; the quantized dense rows with one format for keys and values (int8 and int4 blocks,
/// unrotated and Walsh–Hadamard-rotated); the SWAN rows in the paper's form (magnitude
/// selection, unscaled, no sink; bitmask rows with int8 / int4 values and the paper's index
/// lists with fp8 values); KIVI at 2 and 4 bits and the TurboQuant-style codes at 2, 3 and 4
/// bits — every family at each buffer the SWAN rows keep (`b` newest positions in f16) and at
/// no other, without a sink. On a sliding-window model every configuration keeps f16 rings,
/// so the formats differ on the global layers alone.
pub fn equal_footing(runs: &mut Vec<FrontierRun>, windowed: bool) {
    let mut buffers: Vec<usize> = runs.iter().filter(|r| r.k.is_some()).map(|r| r.buffer).collect();
    buffers.sort_unstable();
    buffers.dedup();
    runs.retain(|r| match r.k {
        None => {
            *r == FrontierRun::dense(Code::F16, None)
                || (r.is_plain_quantized()
                    && matches!(r.values, Code::Int8 | Code::Int4)
                    && matches!(r.rotate, None | Some(BasisKind::Hadamard))
                    && buffers.contains(&r.buffer))
        }
        Some(_) => {
            // Integer codes in bitmask rows (smaller than index lists once k > d_h/8), fp8
            // in the paper's index lists.
            let encoding = matches!(
                (r.index, r.values),
                (Some(SwanIndex::Bitmask), Code::Int8 | Code::Int4)
                    | (Some(SwanIndex::List), Code::Fp8)
            );
            encoding
                && r.kv.is_none()
                && r.select.is_none()
                && r.norm.is_none()
                && r.sink == 0
                && r.ring.is_none()
                && r.ring_values.is_none()
        }
    });
    for &b in &buffers {
        runs.extend([2, 4].map(|bits| FrontierRun::kivi(bits, b)));
        runs.extend([2, 3, 4].map(|bits| FrontierRun::turbo(bits, b)));
    }
    if windowed {
        for r in runs.iter_mut().filter(|r| r.values != Code::F16 || r.k.is_some()) {
            r.ring = Some(Code::F16);
        }
    }
}
