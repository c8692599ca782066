//! Caches chosen at run time by name and parameters: `NAME[:key=value,...]`.
//!
//! | spec | cache |
//! |---|---|
//! | `dense[:format=f16\|bf16\|f32\|fp8\|int8\|int4,b=N,buffer=f16\|bf16\|f32,values=fp8\|int8\|int4,rotate=none\|hadamard\|hadamard-v\|hadamard-signs[:seed]\|hadamard-value-signs[:seed]\|hadamard-jitter[:seed]\|random[:seed]\|calibrated,proj=PATH,sink=N]` | [`DenseCache`] (f16/bf16/f32; default f16), [`crate::cache::QuantCache`] (fp8 with a per-token scale, int8 = `q8_0` blocks, int4 = `q4_0` blocks) |
//! | `swan[:k=32,kv=32,b=128,index=list\|bitmask,value=fp8\|f16\|bf16\|f32\|int8\|int4,buffer=f16\|bf16\|f32,scale=auto\|none,select=magnitude\|query,norm=none\|eigen,sink=N,basis=…,proj=PATH]` | [`SwanCache`] |
//! | `kivi[:bits=2\|4,group=32,b=128,buffer=f16\|bf16\|f32,rotate=…,sink=N]` | KIVI codes behind a buffer ([`crate::cache::BufferedCache`]) |
//! | `turbo[:bits=2\|3\|4,qjl=off\|on,b=128,buffer=…,rotate=random:0\|hadamard-signs:S\|…,sink=N]` | TurboQuant-style codes behind a buffer ([`crate::cache::BufferedCache`]); `qjl=on`: keys in the inner-product form (QJL sketch of the residual) |
//! | `tiered:span=A..B[,policy=…]` | WnW tiered store ([`crate::cache::TieredCache`]) |
//! | `swan+tiered:…` | both key sets: SWAN rotation, WnW store with sparse fp8 audio rows |
//! | `turbo+tiered:…` | `turbo` keys (`bits`, `qjl`, `rotate`, `proj`) and the tiered keys: WnW store with TurboQuant-style coded audio rows |
//!
//! `b=N` keeps the `N` newest positions of a quantized dense cache exact in
//! `buffer=f16|bf16|f32` (default f16) and quantizes each position as it leaves that
//! buffer ([`crate::cache::BufferedQuantCache`]): the recent-token buffer of KIVI and of
//! SWAN (`b=128` is both papers' setting), so a quantized cache and a SWAN cache can be
//! compared on equal footing. Default `b=0`, llama.cpp's condition; keys and values in one
//! format; saved and reopened as kv-sparse's whole-row layout (not with a sink). `b` may not
//! exceed the model's context (on every cache kind).
//!
//! `rotate` turns q/k (and, absorbed into `W_V`/`W_O`, v/o) into another orthonormal basis
//! before storing: `hadamard` is the normalized Walsh–Hadamard matrix (llama.cpp's rotation
//! for a quantized KV cache), `hadamard-v` its value half alone (keys stay in their own
//! basis: better at int4 on Gemma 3, whose keys lose more once spread by any rotation),
//! `hadamard-signs[:seed]` the Walsh–Hadamard matrices with seeded random row signs (the
//! randomized Hadamard transform: the same structure, another sign pattern per draw),
//! `hadamard-value-signs[:seed]` the plain Walsh–Hadamard keys with sign-randomized value
//! blocks (the keys exactly `hadamard`'s, quantized values rounded otherwise per draw),
//! `hadamard-jitter[:seed]` the Walsh–Hadamard bases turned by 10⁻⁵ rad in random planes
//! (a probe of how far rounding-sized differences move a quantized cache's cost),
//! `random[:seed]` Haar-random orthogonal bases, `calibrated` the SWAN basis (same file as `basis=calibrated`). `values=fp8|int8|int4`
//! stores a quantized dense cache's value rows in another quantized format than its keys
//! (`format=int8,values=int4` is llama.cpp's `-ctk q8_0 -ctv q4_0`; the quantized rings of a
//! sliding-window model follow it; such a cache is not persisted). `sink=N` keeps the first
//! `N` positions of a quantized dense cache (fp8/int8/int4) in `f32` — the attention sink,
//! whose rounding error every query of every window shares (lossless for those rows; on a
//! sliding-window model the quantized rings keep them too while they are inside the window;
//! default `0`). A SWAN spec's `sink=N` keeps them in `f32` beside its buffer, never
//! evicted into sparse rows (and in its quantized rings, as a dense spec's).
//! SWAN's `index=bitmask` names kept components with a `d_h`-bit mask instead of `u8`
//! indices; `value=int8|int4` stores kept values as symmetric integers with one f16 scale per
//! row. `select=query` prunes evicted keys by `|k̂_j|·√E[q̂_j²]` (the queries' energy along
//! each basis vector, stored with a calibrated basis) instead of SWAN's `|k̂_j|` (the default,
//! `magnitude`): which keeps more quality is a property of the model, measured by
//! `kvtide reproduce --only frontier`. `norm=eigen` stores each basis component divided by a
//! power of two from its calibrated energy (keys: their own energy along the QK basis
//! vector; values: the VO eigenvalue), so that one row scale suits every component
//! (see [`crate::cache::ComponentNorm`]; default `none`).
//!
//! Every cache also takes `queries=f32|int8|q8_0` (how the attention kernels take the
//! queries — against int8 or 4-bit keys (dense `format=int8` / `format=int4` rows, SWAN
//! `value=int8` rows, an `int8` / `int4` ring) `int8` rounds them to int8 per head and step
//! and scores by exact integer products, lossy, where the CPU has AVX2; `q8_0` rounds them to ggml's `q8_0`
//! blocks of 32 and scores in f32 against keys of any format of a quantized dense, SWAN or
//! windowed cache — the queries llama.cpp's CPU flash attention scores its `q8_0`/`q4_0`
//! caches with, lossy, for reproducing that engine; default `f32`, lossless; a cache
//! without int8 keys refuses `int8`, a dense float cache `q8_0`), `threads=N` (attention threads; default: all cores) and
//! `ring=f32|f16|bf16|fp8|int8|int4`: on a model with sliding-window layers (Gemma 3) the
//! cache named serves the global layers and every local layer keeps a dense ring of its
//! window ([`crate::cache::WindowedCache`]) in this format (default: the format of a `dense`
//! spec — so `dense:format=int4` quantizes every layer, as llama.cpp's `-ctk/-ctv q4_0`
//! does — the buffer format of a SWAN spec, f16 otherwise); `ring_values=fp8|int8|int4`
//! beside a quantized `ring=` stores the rings' value rows in a format of their own (as
//! `values=` does a dense cache's: `ring=int8,ring_values=int4` is llama.cpp's
//! `-ctk q8_0 -ctv q4_0` on the local layers). A quantized ring stores q/k in
//! the basis the spec rotates into (`rotate=` of a dense spec, `basis=` of a SWAN spec), or
//! in `ring_rotate=none|hadamard|hadamard-v|hadamard-signs[:seed]|hadamard-value-signs[:seed]|hadamard-jitter[:seed]|random[:seed]` when given: the model then absorbs
//! that basis's v/o rotation on the local layers (the spec's own on the others) and a
//! quantized ring rotates q/k by its q/k half — a 4-bit ring, say, in Walsh–Hadamard
//! coordinates beside SWAN's calibrated global layers. SWAN
//! defaults are the paper's operating point: `k = kv = head_dim/2`, fp8 values with
//! per-head scales, `b = 128`, f16 buffer, calibrated basis. `basis` is `calibrated`
//! (needs a `ProjectionSet` file: `proj=PATH`, or the default the application supplies through
//! [`CacheSpec::with_default_projection`]; `kvtide calibrate` writes one), `identity`, `random[:seed]`, or an ablation of the
//! calibrated file: `layer-shuffle[:seed]`, `head-shuffle[:seed]`, `kv-shuffle`
//! (`papers/swan.txt`, projection ablations).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use half::{bf16, f16};
use kv_sparse::ValueFormat;
use kv_sparse::coded::{Bitmask, CodedStore, Elems, Int4Values, Int8Values, List, ValueKind};
use kv_sparse::csr::CsrStore;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::kivi::KiviRows;
use kv_sparse::quant::{DenseCodec, DenseFormat, Fp8Rows, Int4Blocks, Int8Blocks};
use kv_sparse::turbo::{TurboQjlRows, TurboRows};
use projection::{Basis, BasisKind, ModelDims, ProjectionSet, Stream};

use crate::cache::TieredSpec;
use crate::cache::{
    BufferedCache, BufferedHistory, BufferedQuantCache, CacheShape, ComponentNorm, DenseCache,
    Fp8Scale, KeySelect, KvCache, QuantCache, SwanCache, SwanConfig, SwanIndex,
};
use crate::error::{Error, Result};
use crate::llama::Llama;

/// SWAN parameters of a spec (`k`/`kv` default to half the head when `None`).
#[derive(Clone, Debug, PartialEq)]
pub struct SwanSpec {
    /// Kept key components (`k`).
    pub k_key: Option<usize>,
    /// Kept value components (`kv`).
    pub k_value: Option<usize>,
    /// Dense buffer rows (`b`).
    pub buffer: usize,
    /// Index encoding (`index`).
    pub index: SwanIndex,
    /// Sparse value code (`value`).
    pub value: ValueKind,
    /// Buffer format (`buffer`).
    pub buffer_format: ValueFormat,
    /// fp8 scaling (`scale`).
    pub scale: Fp8Scale,
    /// Which basis (`basis`).
    pub basis: BasisKind,
    /// Projection file for calibrated bases and their ablations (`proj`).
    pub proj: Option<PathBuf>,
    /// Key pruning rule (`select=magnitude|query`).
    pub key_select: KeySelect,
    /// Component scaling (`norm=none|eigen`).
    pub norm: ComponentNorm,
    /// Positions kept in `f32` beside the buffer, never evicted (`sink=N`; `0`: none).
    pub sink: usize,
}

impl Default for SwanSpec {
    fn default() -> Self {
        Self {
            k_key: None,
            k_value: None,
            buffer: 128,
            index: SwanIndex::List,
            value: ValueKind::Elems(ValueFormat::Fp8E4M3),
            buffer_format: ValueFormat::F16,
            scale: Fp8Scale::Auto,
            basis: BasisKind::Calibrated,
            proj: None,
            key_select: KeySelect::Magnitude,
            norm: ComponentNorm::None,
            sink: 0,
        }
    }
}

/// How a dense cache stores each element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseStorage {
    /// A float format (f32, f16, bf16).
    Float(ValueFormat),
    /// A quantized format (fp8 with a per-token scale, int8 / int4 blocks).
    Quant(DenseFormat),
    /// Keys in one quantized format, values in another (`format=K,values=V`; llama.cpp's
    /// `-ctk K -ctv V`). Two equal formats are [`DenseStorage::Quant`].
    Mixed {
        /// Key rows.
        keys: DenseFormat,
        /// Value rows.
        values: DenseFormat,
    },
}

impl DenseStorage {
    /// The quantized formats of the key and the value rows (equal unless
    /// [`DenseStorage::Mixed`]); `None` for a float format.
    pub fn quant_formats(self) -> Option<(DenseFormat, DenseFormat)> {
        match self {
            DenseStorage::Float(_) => None,
            DenseStorage::Quant(f) => Some((f, f)),
            DenseStorage::Mixed { keys, values } => Some((keys, values)),
        }
    }

    /// Whether rows are quantized (fp8 / int8 / int4, for keys, values or both).
    pub fn is_quantized(self) -> bool {
        self.quant_formats().is_some()
    }
}

/// As a spec writes it: `int4`, or `int8,values=int4` for mixed formats.
impl std::fmt::Display for DenseStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DenseStorage::Float(v) => write!(f, "{v}"),
            DenseStorage::Quant(q) => write!(f, "{q}"),
            DenseStorage::Mixed { keys, values } => write!(f, "{keys},values={values}"),
        }
    }
}

/// Dense cache parameters of a spec.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseSpec {
    /// Element storage (`format`).
    pub format: DenseStorage,
    /// Rotation of q/k and v/o before storing (`rotate`; `None` = `none`).
    pub rotate: Option<BasisKind>,
    /// Projection file for `rotate=calibrated` (`proj`).
    pub proj: Option<PathBuf>,
    /// Positions of a quantized cache kept in `f32` before its quantized rows (`sink`;
    /// `0` = none, the default): see [`QuantCache::with_sink`].
    pub sink: usize,
    /// The newest positions a quantized cache keeps exact in [`DenseSpec::buffer_format`]
    /// (`b`; `0` = none, the default, llama.cpp's condition): see
    /// [`crate::cache::BufferedQuantCache`].
    pub buffer: usize,
    /// The buffer's float format (`buffer=f16|bf16|f32`; default `f16`).
    pub buffer_format: ValueFormat,
}

impl DenseSpec {
    /// Plain dense storage in `format`, no rotation, no buffer.
    pub fn new(format: DenseStorage) -> Self {
        Self {
            format,
            rotate: None,
            proj: None,
            sink: 0,
            buffer: 0,
            buffer_format: ValueFormat::F16,
        }
    }

    fn parse(p: &mut Params<'_>) -> Result<Self> {
        let format = storage_param(p, "format")?.unwrap_or(DenseStorage::Float(ValueFormat::F16));
        let values = storage_param(p, "values")?;
        let format = with_value_rows(p.spec(), ("format", format), ("values", values))?;
        let rotate = match p.take("rotate") {
            None | Some("none") => None,
            Some(r) => Some(
                r.parse::<BasisKind>().map_err(|e| spec_err(p.spec(), format!("rotate: {e}")))?,
            ),
        };
        let sink = sink_param(p)?;
        if sink > 0 && !format.is_quantized() {
            return Err(spec_err(
                p.spec(),
                format!(
                    "sink={sink}: format={format} keeps every position in full already; sink= applies to fp8, int8 and int4"
                ),
            ));
        }
        let buffer = p.parse_opt::<usize>("b")?.unwrap_or(0);
        let buffer_format = format_param(p, "buffer", &DENSE_FORMATS)?;
        if buffer > 0 {
            match format {
                DenseStorage::Quant(_) => {}
                DenseStorage::Float(_) => {
                    return Err(spec_err(
                        p.spec(),
                        format!(
                            "b={buffer}: format={format} keeps every position in full already; b= applies to fp8, int8 and int4"
                        ),
                    ));
                }
                DenseStorage::Mixed { .. } => {
                    return Err(spec_err(
                        p.spec(),
                        format!(
                            "b={buffer}: a buffered cache keeps keys and values in one format; format={format} mixes two"
                        ),
                    ));
                }
            }
        } else if let Some(f) = buffer_format {
            return Err(spec_err(p.spec(), format!("buffer={f} needs a buffer: give b=N (N > 0)")));
        }
        Ok(Self {
            format,
            rotate,
            proj: p.take("proj").map(PathBuf::from),
            sink,
            buffer,
            buffer_format: buffer_format.unwrap_or(ValueFormat::F16),
        })
    }
}

/// `keys` with its value rows in `values` when given (`format=K,values=V`,
/// `ring=K,ring_values=V`): two quantized formats make a [`DenseStorage::Mixed`] storage (two
/// equal ones the plain [`DenseStorage::Quant`]); a float format on either side is an error.
fn with_value_rows(
    spec: &str,
    (key_name, keys): (&str, DenseStorage),
    (value_name, values): (&str, Option<DenseStorage>),
) -> Result<DenseStorage> {
    Ok(match (keys, values) {
        (f, None) => f,
        (DenseStorage::Quant(k), Some(DenseStorage::Quant(v))) if k == v => DenseStorage::Quant(k),
        (DenseStorage::Quant(keys), Some(DenseStorage::Quant(values))) => {
            DenseStorage::Mixed { keys, values }
        }
        (keys, Some(values)) => {
            return Err(spec_err(
                spec,
                format!(
                    "{key_name}={keys},{value_name}={values}: separate value rows take a quantized format (fp8, int8, int4) beside quantized keys"
                ),
            ));
        }
    })
}

/// `sink=N`: positions kept in `f32` (`0` when absent).
fn sink_param(p: &mut Params<'_>) -> Result<usize> {
    match p.take("sink") {
        None => Ok(0),
        Some(n) => n
            .parse::<usize>()
            .map_err(|_| spec_err(p.spec(), format!("sink={n}: expected a number of positions"))),
    }
}

/// A history format coded past a recent-token buffer (`kivi:` and `turbo:` specs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodedFormat {
    /// KIVI at `bits` ∈ {2, 4}: keys per channel over groups of `group` tokens, values per
    /// token over groups of `group` channels ([`kv_sparse::kivi`]).
    Kivi {
        /// Bits per code.
        bits: usize,
        /// Tokens per key group, channels per value group.
        group: usize,
    },
    /// TurboQuant-style at `bits` ∈ {2, 3, 4}: f16 norm and Lloyd-Max codes of the
    /// direction's coordinates in a random basis ([`kv_sparse::turbo`]).
    Turbo {
        /// Bits per code.
        bits: usize,
        /// Keys in the paper's inner-product form (`qjl=on`): `bits − 1` bits of codes plus
        /// the 1-bit QJL sketch of the residual, unbiased scores
        /// ([`kv_sparse::turbo::TurboQjlRows`]); values stay at `bits`.
        qjl: bool,
    },
}

/// Parameters of a `kivi:` or `turbo:` spec: the coded history behind a buffer
/// ([`crate::cache::BufferedCache`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CodedSpec {
    /// The history format (`bits`, `group`).
    pub format: CodedFormat,
    /// Recent-token buffer rows (`b`; default 128, both papers' residual).
    pub buffer: usize,
    /// The buffer's float format (`buffer=f16|bf16|f32`; default f16).
    pub buffer_format: ValueFormat,
    /// The basis q/k and v/o are turned into before coding (`rotate`; KIVI: none by
    /// default, turbo: `random:0`, the paper's random rotation).
    pub rotate: Option<BasisKind>,
    /// Projection file for `rotate=calibrated` (`proj`).
    pub proj: Option<PathBuf>,
    /// Positions kept in `f32` before everything else (`sink=N`; default 0).
    pub sink: usize,
}

impl CodedSpec {
    fn parse(p: &mut Params<'_>, kivi: bool) -> Result<Self> {
        let allowed: &[usize] = if kivi { &[2, 4] } else { &[2, 3, 4] };
        let bits = p.parse_opt::<usize>("bits")?.unwrap_or(if kivi { 2 } else { 3 });
        if !allowed.contains(&bits) {
            return Err(spec_err(p.spec(), format!("bits={bits}: expected one of {allowed:?}")));
        }
        let format = if kivi {
            let group = p.parse_opt::<usize>("group")?.unwrap_or(32);
            if group == 0 {
                return Err(spec_err(p.spec(), "group=0: expected a positive group size"));
            }
            CodedFormat::Kivi { bits, group }
        } else {
            let qjl = match p.take("qjl") {
                None | Some("off") => false,
                Some("on") => true,
                Some(other) => {
                    return Err(spec_err(p.spec(), format!("qjl={other}: expected on or off")));
                }
            };
            CodedFormat::Turbo { bits, qjl }
        };
        let rotate = match p.take("rotate") {
            Some("none") => None,
            None if kivi => None,
            None => Some(BasisKind::Random { seed: 0 }),
            Some(r) => Some(
                r.parse::<BasisKind>().map_err(|e| spec_err(p.spec(), format!("rotate: {e}")))?,
            ),
        };
        Ok(Self {
            format,
            buffer: p.parse_opt::<usize>("b")?.unwrap_or(128),
            buffer_format: format_param(p, "buffer", &DENSE_FORMATS)?.unwrap_or(ValueFormat::F16),
            rotate,
            proj: p.take("proj").map(PathBuf::from),
            sink: sink_param(p)?,
        })
    }

    /// The projection set `rotate=` names for `model` (`None` without a rotation).
    ///
    /// # Errors
    /// As [`SwanSpec::projection`].
    pub fn projection(&self, model: &Llama) -> Result<Option<ProjectionSet>> {
        self.rotate.map(|basis| projection_set(basis, self.proj.as_deref(), model)).transpose()
    }

    /// The tiered store's rows for this format (`turbo+tiered`): keys and values in the
    /// TurboQuant-style codes, keys with the QJL sketch under `qjl=on`; KIVI's values code
    /// per token on both sides.
    pub fn span_rows(&self) -> crate::cache::SpanRows {
        use kv_tiered::RowCodec;
        match self.format {
            CodedFormat::Turbo { bits, qjl } => {
                let keys = if qjl { RowCodec::TurboQjl { bits } } else { RowCodec::Turbo { bits } };
                crate::cache::SpanRows::Coded(keys, RowCodec::Turbo { bits })
            }
            CodedFormat::Kivi { bits, group } => {
                let rows = RowCodec::Groups { bits, group };
                crate::cache::SpanRows::Coded(rows, rows)
            }
        }
    }

    /// Checks the spec against a head size: a KIVI group must divide it, coded rows must be
    /// whole bytes.
    fn check_head_dim(&self, spec: &str, head_dim: usize) -> Result<()> {
        let checked = match self.format {
            CodedFormat::Kivi { bits, group } => {
                kv_sparse::kivi::check_layout("kivi spec", bits, head_dim, group)
            }
            CodedFormat::Turbo { bits, qjl: false } => {
                kv_sparse::turbo::check_layout("turbo spec", bits, head_dim)
            }
            CodedFormat::Turbo { bits, qjl: true } => {
                kv_sparse::turbo::check_qjl_layout("turbo spec", bits, head_dim)
            }
        };
        checked.map_err(|e| spec_err(spec, e.to_string()))
    }
}

/// What kind of cache a spec names.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheKind {
    /// Full K/V in one format, optionally rotated.
    Dense(DenseSpec),
    /// SWAN hybrid cache.
    Swan(SwanSpec),
    /// WnW tiered store.
    Tiered(TieredSpec),
    /// SWAN rotation and sparse rows inside the WnW store.
    SwanTiered(SwanSpec, TieredSpec),
    /// A coded history (KIVI, TurboQuant-style) behind a recent-token buffer.
    Coded(CodedSpec),
    /// The TurboQuant-style rotation and coded rows inside the WnW store (`turbo+tiered`).
    CodedTiered(CodedSpec, TieredSpec),
}

/// A parsed cache specification.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheSpec {
    /// The cache and its parameters.
    pub kind: CacheKind,
    /// Attention threads (`None`: all cores).
    pub threads: Option<usize>,
    /// Row format of the local layers' window rings (`ring=`, with `ring_values=` its value
    /// rows' when they differ; `None`: follow the spec, see the module docs).
    pub ring: Option<DenseStorage>,
    /// The basis the local layers' rings store K/V in when it is not the spec's own
    /// (`ring_rotate=`; `None`: the spec's, see the module docs).
    pub ring_rotate: Option<BasisKind>,
    /// Query precision of the score products over int8 keys (`queries=`; `None`: f32).
    pub queries: Option<attn_kernels::QueryPrecision>,
    text: String,
}

pub(crate) fn spec_err(spec: &str, reason: impl Into<String>) -> Error {
    Error::CacheSpec { spec: spec.to_string(), reason: reason.into() }
}

/// `key=value` pairs of a spec, each consumed at most once; leftovers are an error.
pub(crate) struct Params<'a> {
    spec: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    fn parse(spec: &'a str, body: &'a str) -> Result<Self> {
        let mut pairs = Vec::new();
        for item in body.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            if pairs.iter().any(|(seen, _)| *seen == k) {
                return Err(spec_err(spec, format!("`{k}` given twice")));
            }
            pairs.push((k.trim(), v.trim()));
        }
        Ok(Self { spec, pairs })
    }

    /// Whether `key` is given (not consumed).
    pub(crate) fn has(&self, key: &str) -> bool {
        self.pairs.iter().any(|(k, _)| *k == key)
    }

    /// Removes and returns the raw value of `key`.
    pub(crate) fn take(&mut self, key: &str) -> Option<&'a str> {
        let i = self.pairs.iter().position(|(k, _)| *k == key)?;
        Some(self.pairs.remove(i).1)
    }

    /// Removes `key` and parses its value.
    pub(crate) fn parse_opt<T: FromStr>(&mut self, key: &str) -> Result<Option<T>> {
        let spec = self.spec;
        self.take(key)
            .map(|v| {
                v.parse().map_err(|_| spec_err(spec, format!("`{key}={v}` is not a valid value")))
            })
            .transpose()
    }

    /// The spec text, for errors.
    pub(crate) fn spec(&self) -> &'a str {
        self.spec
    }

    fn finish(self) -> Result<()> {
        match self.pairs.first() {
            Some((k, _)) => Err(spec_err(self.spec, format!("unknown parameter `{k}`"))),
            None => Ok(()),
        }
    }
}

fn format_param(
    p: &mut Params<'_>,
    key: &str,
    allowed: &[ValueFormat],
) -> Result<Option<ValueFormat>> {
    let Some(v) = p.take(key) else { return Ok(None) };
    let f = match v {
        "f32" => ValueFormat::F32,
        "f16" => ValueFormat::F16,
        "bf16" => ValueFormat::Bf16,
        "fp8" | "e4m3" => ValueFormat::Fp8E4M3,
        _ => return Err(spec_err(p.spec(), format!("`{key}={v}`: unknown format"))),
    };
    if !allowed.contains(&f) {
        return Err(spec_err(p.spec(), format!("`{key}={v}` is not allowed here")));
    }
    Ok(Some(f))
}

/// A dense storage parameter (`key=f32|f16|bf16|fp8|int8|int4`, also `e4m3`, `q8_0`, `q4_0`).
fn storage_param(p: &mut Params<'_>, key: &str) -> Result<Option<DenseStorage>> {
    Ok(Some(match p.take(key) {
        None => return Ok(None),
        Some("f16") => DenseStorage::Float(ValueFormat::F16),
        Some("f32") => DenseStorage::Float(ValueFormat::F32),
        Some("bf16") => DenseStorage::Float(ValueFormat::Bf16),
        Some("fp8") | Some("e4m3") => DenseStorage::Quant(DenseFormat::Fp8),
        Some("int8") | Some("q8_0") => DenseStorage::Quant(DenseFormat::Int8),
        Some("int4") | Some("q4_0") => DenseStorage::Quant(DenseFormat::Int4),
        Some(v) => return Err(spec_err(p.spec(), format!("`{key}={v}`: unknown format"))),
    }))
}

const DENSE_FORMATS: [ValueFormat; 3] = [ValueFormat::F32, ValueFormat::F16, ValueFormat::Bf16];
const VALUE_FORMATS: [ValueFormat; 4] =
    [ValueFormat::F32, ValueFormat::F16, ValueFormat::Bf16, ValueFormat::Fp8E4M3];

impl SwanSpec {
    pub(crate) fn parse(p: &mut Params<'_>) -> Result<Self> {
        let d = Self::default();
        let basis = match p.take("basis") {
            Some(b) => {
                b.parse::<BasisKind>().map_err(|e| spec_err(p.spec(), format!("basis: {e}")))?
            }
            None => d.basis,
        };
        let scale = match p.take("scale") {
            None | Some("auto") => Fp8Scale::Auto,
            Some("none") => Fp8Scale::None,
            Some(v) => {
                return Err(spec_err(p.spec(), format!("`scale={v}`: expected auto or none")));
            }
        };
        let index = match p.take("index") {
            None | Some("list") => SwanIndex::List,
            Some("bitmask") | Some("mask") => SwanIndex::Bitmask,
            Some(v) => {
                return Err(spec_err(p.spec(), format!("`index={v}`: expected list or bitmask")));
            }
        };
        let key_select = match p.take("select") {
            None | Some("magnitude") => KeySelect::Magnitude,
            Some("query") => KeySelect::Query,
            Some(v) => {
                return Err(spec_err(
                    p.spec(),
                    format!("`select={v}`: expected magnitude or query"),
                ));
            }
        };
        let norm = match p.take("norm") {
            None | Some("none") => ComponentNorm::None,
            Some("eigen") => ComponentNorm::Eigen,
            Some(v) => {
                return Err(spec_err(p.spec(), format!("`norm={v}`: expected none or eigen")));
            }
        };
        let value = match p.take("value") {
            Some("int8") => ValueKind::Int8,
            Some("int4") => ValueKind::Int4,
            Some(v) => {
                let mut one = Params { spec: p.spec(), pairs: vec![("value", v)] };
                ValueKind::Elems(
                    format_param(&mut one, "value", &VALUE_FORMATS)?.unwrap_or(ValueFormat::F16),
                )
            }
            None => d.value,
        };
        Ok(Self {
            k_key: p.parse_opt("k")?,
            k_value: p.parse_opt("kv")?,
            buffer: p.parse_opt("b")?.unwrap_or(d.buffer),
            index,
            value,
            buffer_format: format_param(p, "buffer", &DENSE_FORMATS)?.unwrap_or(d.buffer_format),
            scale,
            basis,
            proj: p.take("proj").map(PathBuf::from),
            key_select,
            norm,
            sink: sink_param(p)?,
        })
    }

    /// The cache knobs for heads of width `head_dim`.
    pub fn config(&self, head_dim: usize) -> SwanConfig {
        SwanConfig {
            k_key: self.k_key.unwrap_or(head_dim / 2),
            k_value: self.k_value.or(self.k_key).unwrap_or(head_dim / 2),
            buffer: self.buffer,
            index: self.index,
            value: self.value,
            buffer_format: self.buffer_format,
            fp8_scale: self.scale,
            key_select: self.key_select,
            norm: self.norm,
            sink: self.sink,
        }
    }

    /// Builds (or loads) the projection set this spec names for `model`.
    ///
    /// # Errors
    /// [`Error::Projection`] if the file is missing, corrupt or for another model.
    pub fn projection(&self, model: &Llama) -> Result<ProjectionSet> {
        projection_set(self.basis, self.proj.as_deref(), model)
    }
}

/// The projection set a `basis=`/`rotate=` names for `model`: built (identity, random,
/// Hadamard) or loaded from `proj` (calibrated and its ablations).
fn projection_set(basis: BasisKind, proj: Option<&Path>, model: &Llama) -> Result<ProjectionSet> {
    let cfg = model.config();
    let dims = ModelDims::new(cfg.num_layers, cfg.q_heads, cfg.kv_heads, cfg.head_dim)?;
    let load = || {
        let path = proj.ok_or_else(|| Error::CacheSpec {
            spec: format!("basis={basis}"),
            reason: "this basis needs a projection file: give proj=PATH".into(),
        })?;
        ProjectionSet::load_for(path, &dims, None).map_err(|e| Error::CacheSpec {
            spec: format!("proj={}", path.display()),
            reason: format!("{e} (run `kvtide calibrate` first)"),
        })
    };
    Ok(match basis {
        BasisKind::Identity => ProjectionSet::identity(dims, &cfg.name)?,
        BasisKind::Random { seed } => ProjectionSet::random(dims, &cfg.name, seed)?,
        BasisKind::Hadamard => ProjectionSet::hadamard(dims, &cfg.name)?,
        BasisKind::HadamardValues => ProjectionSet::hadamard_values(dims, &cfg.name)?,
        BasisKind::SignedHadamard { seed } => {
            ProjectionSet::signed_hadamard(dims, &cfg.name, seed)?
        }
        BasisKind::SignedHadamardValues { seed } => {
            ProjectionSet::signed_hadamard_values(dims, &cfg.name, seed)?
        }
        BasisKind::HadamardJitter { seed } => {
            ProjectionSet::jittered_hadamard(dims, &cfg.name, seed)?
        }
        BasisKind::Calibrated => load()?,
        kind => load()?.ablation(kind)?,
    })
}

impl FromStr for CacheSpec {
    type Err = Error;

    /// # Examples
    /// ```
    /// use models::cache::spec::{CacheKind, CacheSpec};
    /// let s: CacheSpec = "swan:k=32,value=fp8,b=128,basis=random:7".parse()?;
    /// assert!(matches!(s.kind, CacheKind::Swan(ref w) if w.k_key == Some(32) && w.buffer == 128));
    /// assert!("swan:q=3".parse::<CacheSpec>().is_err());
    /// # Ok::<(), models::Error>(())
    /// ```
    fn from_str(text: &str) -> Result<Self> {
        let (name, body) = text.split_once(':').unwrap_or((text, ""));
        let mut p = Params::parse(text, body)?;
        let threads = p.parse_opt::<usize>("threads")?;
        if threads == Some(0) {
            return Err(spec_err(text, "threads must be ≥ 1"));
        }
        let ring = match (storage_param(&mut p, "ring")?, storage_param(&mut p, "ring_values")?) {
            (None, Some(values)) => {
                return Err(spec_err(
                    text,
                    format!("ring_values={values} needs a quantized ring=K beside it"),
                ));
            }
            (None, None) => None,
            (Some(keys), values) => {
                Some(with_value_rows(text, ("ring", keys), ("ring_values", values))?)
            }
        };
        let ring_rotate = match p.take("ring_rotate") {
            None => None,
            Some("none") => Some(BasisKind::Identity),
            Some(r) => {
                let kind = r
                    .parse::<BasisKind>()
                    .map_err(|e| spec_err(text, format!("ring_rotate: {e}")))?;
                if !matches!(
                    kind,
                    BasisKind::Identity
                        | BasisKind::Random { .. }
                        | BasisKind::Hadamard
                        | BasisKind::HadamardValues
                        | BasisKind::SignedHadamard { .. }
                        | BasisKind::SignedHadamardValues { .. }
                        | BasisKind::HadamardJitter { .. }
                ) {
                    return Err(spec_err(
                        text,
                        format!(
                            "ring_rotate={r}: expected none, identity, hadamard, hadamard-v, \
                             hadamard-signs[:seed], hadamard-value-signs[:seed], hadamard-jitter[:seed] or random[:seed] (a calibrated basis is the spec's own: leave \
                             ring_rotate out)"
                        ),
                    ));
                }
                Some(kind)
            }
        };
        let queries = p.parse_opt::<attn_kernels::QueryPrecision>("queries")?;
        let kind = match name {
            "dense" => CacheKind::Dense(DenseSpec::parse(&mut p)?),
            "swan" => CacheKind::Swan(SwanSpec::parse(&mut p)?),
            "tiered" => CacheKind::Tiered(TieredSpec::parse(&mut p)?),
            "kivi" => CacheKind::Coded(CodedSpec::parse(&mut p, true)?),
            "turbo" => CacheKind::Coded(CodedSpec::parse(&mut p, false)?),
            "swan+tiered" => {
                let swan = SwanSpec::parse(&mut p)?;
                if swan.key_select != KeySelect::Magnitude {
                    return Err(spec_err(
                        text,
                        "select=query applies to swan caches; swan+tiered prunes audio keys by \
                         magnitude",
                    ));
                }
                if swan.sink > 0 {
                    return Err(spec_err(
                        text,
                        "sink= applies to swan and quantized dense caches; swan+tiered keeps \
                         its text rows dense already",
                    ));
                }
                if swan.norm != ComponentNorm::None {
                    return Err(spec_err(
                        text,
                        "norm=eigen applies to swan caches; swan+tiered stores audio rows \
                         unscaled",
                    ));
                }
                CacheKind::SwanTiered(swan, TieredSpec::parse(&mut p)?)
            }
            "turbo+tiered" => {
                if let Some(key) = ["b", "buffer", "sink"].into_iter().find(|k| p.has(k)) {
                    return Err(spec_err(
                        text,
                        format!(
                            "{key}= applies to turbo caches; turbo+tiered keeps its text and \
                             generated rows dense already"
                        ),
                    ));
                }
                let coded = CodedSpec::parse(&mut p, false)?;
                CacheKind::CodedTiered(CodedSpec { buffer: 0, ..coded }, TieredSpec::parse(&mut p)?)
            }
            "kivi+tiered" => {
                return Err(spec_err(
                    text,
                    "KIVI's per-channel key groups span tokens, and the tiered store pages rows \
                     one at a time: use turbo+tiered (or swan+tiered)",
                ));
            }
            other => {
                return Err(spec_err(
                    text,
                    format!(
                        "unknown cache `{other}` (dense, swan, kivi, turbo, tiered, swan+tiered, \
                         turbo+tiered)"
                    ),
                ));
            }
        };
        p.finish()?;
        Ok(Self { kind, threads, ring, ring_rotate, queries, text: text.to_string() })
    }
}

impl std::fmt::Display for CacheSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl CacheSpec {
    /// The same spec with `path` as the projection file of every SWAN part that names
    /// none (`proj=` given in the spec wins). Bases other than `identity` and `random`
    /// need a file; the application decides where its default lives.
    ///
    /// # Examples
    /// ```
    /// use models::cache::spec::{CacheKind, CacheSpec};
    /// let s: CacheSpec = "swan:k=16".parse()?;
    /// let s = s.with_default_projection(std::path::Path::new("/tmp/p.safetensors"));
    /// assert!(matches!(s.kind, CacheKind::Swan(ref w) if w.proj.is_some()));
    /// # Ok::<(), models::Error>(())
    /// ```
    pub fn with_default_projection(mut self, path: &Path) -> Self {
        match &mut self.kind {
            CacheKind::Swan(swan) | CacheKind::SwanTiered(swan, _) => {
                swan.proj.get_or_insert_with(|| path.to_path_buf());
            }
            CacheKind::Dense(dense) if dense.rotate.is_some() => {
                dense.proj.get_or_insert_with(|| path.to_path_buf());
            }
            CacheKind::Coded(coded) | CacheKind::CodedTiered(coded, _)
                if coded.rotate.is_some() =>
            {
                coded.proj.get_or_insert_with(|| path.to_path_buf());
            }
            _ => {}
        }
        self
    }

    /// Builds the cache for `model` and the model it must run with (SWAN needs `P_VO`
    /// absorbed; other caches use `model` as is — its weights are shared, not copied).
    ///
    /// # Errors
    /// Projection loading and absorption errors; the caches' parameter errors.
    pub fn build(&self, model: &Llama) -> Result<(Llama, Box<dyn KvCache>)> {
        let (model, make) = self.parts(model)?;
        Ok((model, make()?))
    }

    /// [`CacheSpec::build`] with `n` fresh caches for the one model: the projection is
    /// loaded and absorbed once and shared by every cache (several texts decoded with
    /// the same configuration).
    ///
    /// # Errors
    /// As [`CacheSpec::build`].
    pub fn build_many(&self, model: &Llama, n: usize) -> Result<(Llama, Vec<Box<dyn KvCache>>)> {
        let (model, make) = self.parts(model)?;
        Ok((model, (0..n).map(|_| make()).collect::<Result<_>>()?))
    }

    /// The format of the local layers' window rings (see the module docs).
    pub fn ring_format(&self) -> DenseStorage {
        self.ring.unwrap_or(match &self.kind {
            CacheKind::Dense(d) => d.format,
            CacheKind::Swan(s) | CacheKind::SwanTiered(s, _) => {
                DenseStorage::Float(s.buffer_format)
            }
            CacheKind::Coded(c) => DenseStorage::Float(c.buffer_format),
            CacheKind::Tiered(_) | CacheKind::CodedTiered(..) => {
                DenseStorage::Float(ValueFormat::F16)
            }
        })
    }

    /// The model this spec runs with and a maker of fresh caches for it: the spec's cache,
    /// wrapped in a [`crate::cache::WindowedCache`] when the model has sliding-window layers
    /// (the spec's cache then serves the global layers alone, with their projections).
    /// The recent-token buffer rows the spec keeps exact (`b`; 0 for none).
    pub fn buffer_rows(&self) -> usize {
        match &self.kind {
            CacheKind::Dense(d) => d.buffer,
            CacheKind::Swan(s) | CacheKind::SwanTiered(s, _) => s.buffer,
            CacheKind::Coded(c) => c.buffer,
            CacheKind::Tiered(_) | CacheKind::CodedTiered(..) => 0,
        }
    }

    fn parts(&self, model: &Llama) -> Result<(Llama, CacheMaker<'_>)> {
        let context = model.config().max_position_embeddings;
        let b = self.buffer_rows();
        if context > 0 && b > context {
            return Err(spec_err(
                &self.text,
                format!("b={b} exceeds the model's context of {context} positions"),
            ));
        }
        if let CacheKind::Coded(c) | CacheKind::CodedTiered(c, _) = &self.kind {
            c.check_head_dim(&self.text, model.config().head_dim)?;
        }
        let (model, make) = self.layered_parts(model)?;
        let Some(queries) = self.queries else { return Ok((model, make)) };
        let with_queries = move || -> Result<Box<dyn KvCache>> {
            let mut cache = make()?;
            cache.set_query_precision(queries)?;
            Ok(cache)
        };
        Ok((model, Box::new(with_queries)))
    }

    /// [`CacheSpec::parts`] before the query precision is set.
    fn layered_parts(&self, model: &Llama) -> Result<(Llama, CacheMaker<'_>)> {
        let Some(local) = model.config().local_attention.clone() else {
            let (model, make, _) = self.global_parts(model, None, None)?;
            return Ok((model, make));
        };
        let layers = crate::cache::global_layers(&local);
        let locals: Vec<usize> = (0..local.local.len()).filter(|&i| local.local[i]).collect();
        let ring_set = match self.ring_rotate {
            Some(basis) if !locals.is_empty() => Some(projection_set(basis, None, model)?),
            _ => None,
        };
        let ring = ring_set.as_ref().map(|set| (locals.as_slice(), set));
        let (model, make, set) = self.global_parts(model, Some(&layers), ring)?;
        let (format, threads) = (self.ring_format(), self.threads.unwrap_or_else(default_threads));
        // A quantized ring stores q/k in the basis the model's set gives its layer — the
        // spec's own, or `ring_rotate`'s — (its values already are: the model absorbed the
        // whole set); a float ring attends the same either way.
        let rotation = match set {
            Some(set) if format.is_quantized() && !locals.is_empty() => {
                Some(Arc::new(select_layers(&set, &locals)?))
            }
            _ => None,
        };
        // The spec's sink holds for its quantized rings too (a float ring keeps all).
        let sink = match &self.kind {
            CacheKind::Dense(d) if format.is_quantized() => d.sink,
            CacheKind::Swan(s) if format.is_quantized() => s.sink,
            _ => 0,
        };
        let wrap = move || -> Result<Box<dyn KvCache>> {
            let (global, rotation) = (make()?, rotation.clone());
            Ok(Box::new(crate::cache::WindowedCache::with_ring_sink(
                &local,
                (format, sink),
                rotation,
                global,
                threads,
            )?))
        };
        Ok((model, Box::new(wrap)))
    }

    /// The model this spec runs with, a maker of the spec's own caches, for every layer
    /// or (`layers`) for those layers only, in order, and the projection set the model
    /// absorbed (every layer's), if any.
    fn global_parts(
        &self,
        model: &Llama,
        layers: Option<&[usize]>,
        ring: Option<(&[usize], &ProjectionSet)>,
    ) -> Result<(Llama, CacheMaker<'_>, Option<ProjectionSet>)> {
        let full = CacheShape::of(model.config())?;
        let shape = CacheShape { layers: layers.map_or(full.layers, <[usize]>::len), ..full };
        let threads = self.threads.unwrap_or_else(default_threads);
        // The model absorbs the whole set; the cache rotates with its own layers' bases.
        let served = |set: &ProjectionSet| -> Result<Arc<ProjectionSet>> {
            Ok(Arc::new(match layers {
                Some(l) => select_layers(set, l)?,
                None => set.clone(),
            }))
        };
        // The model absorbs the whole set, its `ring` layers' bases taken from the ring
        // rotation when the spec names one; it is returned for the rings' own rotation.
        let absorb = |full: &ProjectionSet| -> Result<(Llama, ProjectionSet)> {
            let set = match ring {
                Some((locals, r)) => with_layers_of(full, r, locals)?,
                None => full.clone(),
            };
            Ok((model.absorb_vo(&set)?, set))
        };
        // A spec without a rotation of its own: unrotated layers beside the rings' basis.
        let unrotated = || -> Result<(Llama, Option<ProjectionSet>)> {
            if ring.is_none() {
                return Ok((model.clone(), None));
            }
            let (m, set) = absorb(&projection_set(BasisKind::Identity, None, model)?)?;
            Ok((m, Some(set)))
        };
        Ok(match &self.kind {
            CacheKind::Dense(spec) => match spec.rotate {
                None => {
                    let (m, set) = unrotated()?;
                    let make = move || dense(shape, spec, None, threads);
                    (m, Box::new(make), set)
                }
                Some(basis) => {
                    let full = projection_set(basis, spec.proj.as_deref(), model)?;
                    let (absorbed, whole) = absorb(&full)?;
                    let set = served(&full)?;
                    let make = move || dense(shape, spec, Some(set.clone()), threads);
                    (absorbed, Box::new(make), Some(whole))
                }
            },
            CacheKind::Swan(swan) => {
                let full = swan.projection(model)?;
                let cfg = swan.config(shape.head_dim());
                let (absorbed, whole) = absorb(&full)?;
                let set = served(&full)?;
                let make = move || swan_cache(shape, cfg, set.clone(), threads);
                (absorbed, Box::new(make), Some(whole))
            }
            CacheKind::Tiered(t) => {
                let (m, set) = unrotated()?;
                (m, Box::new(move || t.build(shape, None, threads)), set)
            }
            CacheKind::Coded(spec) => match spec.rotate {
                None => {
                    let (m, set) = unrotated()?;
                    (m, Box::new(move || coded(shape, spec, None, threads)), set)
                }
                Some(basis) => {
                    let full = projection_set(basis, spec.proj.as_deref(), model)?;
                    let (absorbed, whole) = absorb(&full)?;
                    let set = served(&full)?;
                    let make = move || coded(shape, spec, Some(set.clone()), threads);
                    (absorbed, Box::new(make), Some(whole))
                }
            },
            CacheKind::SwanTiered(swan, t) => {
                let full = swan.projection(model)?;
                let cfg = swan.config(shape.head_dim());
                let (absorbed, whole) = absorb(&full)?;
                let set = served(&full)?;
                let make = move || t.build(shape, Some((cfg, set.clone())), threads);
                (absorbed, Box::new(make), Some(whole))
            }
            CacheKind::CodedTiered(coded, t) => {
                let rows = coded.span_rows();
                match coded.rotate {
                    None => {
                        let (m, set) = unrotated()?;
                        (m, Box::new(move || t.build_rows(shape, rows, None, threads)), set)
                    }
                    Some(basis) => {
                        let full = projection_set(basis, coded.proj.as_deref(), model)?;
                        let (absorbed, whole) = absorb(&full)?;
                        let set = served(&full)?;
                        let make = move || t.build_rows(shape, rows, Some(set.clone()), threads);
                        (absorbed, Box::new(make), Some(whole))
                    }
                }
            }
        })
    }
}

/// `set` with the bases of `layers` taken from `other` (a set of the same model): the
/// local layers' ring rotation beside the spec's own basis on the others. Matrices only
/// (what absorbing v/o and rotating a ring need): a calibrated basis' eigenvalues and query
/// energies stay with the set the global layers' cache is served from.
fn with_layers_of(
    set: &ProjectionSet,
    other: &ProjectionSet,
    layers: &[usize],
) -> Result<ProjectionSet> {
    let d = set.dims();
    let (mut qk, mut vo) = (Vec::new(), Vec::new());
    for layer in 0..d.layers() {
        let from = if layers.contains(&layer) { other } else { set };
        for h in 0..d.kv_heads() {
            qk.push(Basis::new(from.basis(Stream::Qk, layer, h)?.matrix().clone())?);
            vo.push(Basis::new(from.basis(Stream::Vo, layer, h)?.matrix().clone())?);
        }
    }
    Ok(ProjectionSet::from_parts(d, qk, vo, None, set.provenance().clone())?)
}

/// The bases of `layers` (in order) of `set`, as a set for a model of those layers alone.
fn select_layers(set: &ProjectionSet, layers: &[usize]) -> Result<ProjectionSet> {
    let d = set.dims();
    let dims = ModelDims::new(layers.len(), d.q_heads(), d.kv_heads(), d.head_dim())?;
    let (mut qk, mut vo, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for &layer in layers {
        for h in 0..d.kv_heads() {
            qk.push(set.basis(Stream::Qk, layer, h)?.clone());
            vo.push(set.basis(Stream::Vo, layer, h)?.clone());
            counts.push(set.counts(layer, h)?);
        }
    }
    let counts = counts.into_iter().collect::<Option<Vec<_>>>();
    Ok(ProjectionSet::from_parts(dims, qk, vo, counts, set.provenance().clone())?)
}

/// Makes a fresh cache of one spec ([`CacheSpec::build_many`]).
type CacheMaker<'a> = Box<dyn Fn() -> Result<Box<dyn KvCache>> + 'a>;

fn dense(
    shape: CacheShape,
    spec: &DenseSpec,
    rotation: Option<Arc<ProjectionSet>>,
    threads: usize,
) -> Result<Box<dyn KvCache>> {
    fn float<D: kv_sparse::Value>(
        shape: CacheShape,
        rotation: Option<Arc<ProjectionSet>>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        let cache = DenseCache::<D>::new(shape, threads)?;
        Ok(Box::new(match rotation {
            Some(set) => cache.with_rotation(set)?,
            None => cache,
        }))
    }
    /// A quantized cache of keys `K` and values in `values`.
    fn quant<K: DenseCodec>(
        (shape, values): (CacheShape, DenseFormat),
        rotation: Option<Arc<ProjectionSet>>,
        (threads, sink): (usize, usize),
    ) -> Result<Box<dyn KvCache>> {
        let (s, r, t) = (shape, rotation, threads);
        Ok(match values {
            DenseFormat::Fp8 => Box::new(QuantCache::<K, Fp8Rows>::new(s, r, t)?.with_sink(sink)?),
            DenseFormat::Int8 => {
                Box::new(QuantCache::<K, Int8Blocks>::new(s, r, t)?.with_sink(sink)?)
            }
            DenseFormat::Int4 => {
                Box::new(QuantCache::<K, Int4Blocks>::new(s, r, t)?.with_sink(sink)?)
            }
        })
    }
    let Some((keys, values)) = spec.format.quant_formats() else {
        return match spec.format {
            DenseStorage::Float(ValueFormat::F32) => float::<f32>(shape, rotation, threads),
            DenseStorage::Float(ValueFormat::Bf16) => float::<bf16>(shape, rotation, threads),
            _ => float::<f16>(shape, rotation, threads),
        };
    };
    if spec.buffer > 0 {
        return buffered(shape, spec, keys, rotation, threads);
    }
    let at = (threads, spec.sink);
    match keys {
        DenseFormat::Fp8 => quant::<Fp8Rows>((shape, values), rotation, at),
        DenseFormat::Int8 => quant::<Int8Blocks>((shape, values), rotation, at),
        DenseFormat::Int4 => quant::<Int4Blocks>((shape, values), rotation, at),
    }
}

/// A buffered quantized cache ([`BufferedQuantCache`]) of a dense spec with `b > 0`, whose
/// keys and values share the format `format`.
fn buffered(
    shape: CacheShape,
    spec: &DenseSpec,
    format: DenseFormat,
    rotation: Option<Arc<ProjectionSet>>,
    threads: usize,
) -> Result<Box<dyn KvCache>> {
    fn with<C: DenseCodec>(
        shape: CacheShape,
        spec: &DenseSpec,
        rotation: Option<Arc<ProjectionSet>>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        let (s, r, t, b) = (shape, rotation, threads, spec.buffer);
        Ok(match spec.buffer_format {
            ValueFormat::F32 => {
                Box::new(BufferedQuantCache::<C, f32>::new(s, r, t, b)?.with_sink(spec.sink)?)
            }
            ValueFormat::Bf16 => {
                Box::new(BufferedQuantCache::<C, bf16>::new(s, r, t, b)?.with_sink(spec.sink)?)
            }
            _ => Box::new(BufferedQuantCache::<C, f16>::new(s, r, t, b)?.with_sink(spec.sink)?),
        })
    }
    match format {
        DenseFormat::Fp8 => with::<Fp8Rows>(shape, spec, rotation, threads),
        DenseFormat::Int8 => with::<Int8Blocks>(shape, spec, rotation, threads),
        DenseFormat::Int4 => with::<Int4Blocks>(shape, spec, rotation, threads),
    }
}

/// A buffered cache over a coded history ([`BufferedCache`]) of a `kivi:` or `turbo:` spec.
fn coded(
    shape: CacheShape,
    spec: &CodedSpec,
    rotation: Option<Arc<ProjectionSet>>,
    threads: usize,
) -> Result<Box<dyn KvCache>> {
    fn with<S: BufferedHistory>(
        shape: CacheShape,
        spec: &CodedSpec,
        group: usize,
        rotation: Option<Arc<ProjectionSet>>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        let (s, r, t, b, g) = (shape, rotation, threads, spec.buffer, group);
        Ok(match spec.buffer_format {
            ValueFormat::F32 => {
                Box::new(BufferedCache::<S, f32>::with_group(s, r, t, b, g)?.with_sink(spec.sink)?)
            }
            ValueFormat::Bf16 => {
                Box::new(BufferedCache::<S, bf16>::with_group(s, r, t, b, g)?.with_sink(spec.sink)?)
            }
            _ => {
                Box::new(BufferedCache::<S, f16>::with_group(s, r, t, b, g)?.with_sink(spec.sink)?)
            }
        })
    }
    let (s, r, t) = (shape, rotation, threads);
    match spec.format {
        CodedFormat::Kivi { bits: 2, group } => with::<KiviRows<2>>(s, spec, group, r, t),
        CodedFormat::Kivi { group, .. } => with::<KiviRows<4>>(s, spec, group, r, t),
        CodedFormat::Turbo { bits: 2, qjl: false } => with::<TurboRows<2>>(s, spec, 1, r, t),
        CodedFormat::Turbo { bits: 3, qjl: false } => with::<TurboRows<3>>(s, spec, 1, r, t),
        CodedFormat::Turbo { qjl: false, .. } => with::<TurboRows<4>>(s, spec, 1, r, t),
        CodedFormat::Turbo { bits: 2, qjl: true } => with::<TurboQjlRows<2>>(s, spec, 1, r, t),
        CodedFormat::Turbo { bits: 3, qjl: true } => with::<TurboQjlRows<3>>(s, spec, 1, r, t),
        CodedFormat::Turbo { qjl: true, .. } => with::<TurboQjlRows<4>>(s, spec, 1, r, t),
    }
}

fn swan_cache(
    shape: CacheShape,
    cfg: SwanConfig,
    set: Arc<ProjectionSet>,
    threads: usize,
) -> Result<Box<dyn KvCache>> {
    fn with_buffer<S: crate::cache::SwanRows>(
        shape: CacheShape,
        cfg: SwanConfig,
        set: Arc<ProjectionSet>,
        threads: usize,
    ) -> Result<Box<dyn KvCache>> {
        Ok(match cfg.buffer_format {
            ValueFormat::F32 => Box::new(SwanCache::<S, f32>::new(shape, cfg, set, threads)?),
            ValueFormat::Bf16 => Box::new(SwanCache::<S, bf16>::new(shape, cfg, set, threads)?),
            _ => Box::new(SwanCache::<S, f16>::new(shape, cfg, set, threads)?),
        })
    }
    type B = Bitmask;
    type L = List<u8>;
    let (s, c, st) = (shape, cfg, set);
    match (cfg.index, cfg.value) {
        (SwanIndex::List, ValueKind::Elems(ValueFormat::F32)) => {
            with_buffer::<CsrStore<u8, f32>>(s, c, st, threads)
        }
        (SwanIndex::List, ValueKind::Elems(ValueFormat::F16)) => {
            with_buffer::<CsrStore<u8, f16>>(s, c, st, threads)
        }
        (SwanIndex::List, ValueKind::Elems(ValueFormat::Bf16)) => {
            with_buffer::<CsrStore<u8, bf16>>(s, c, st, threads)
        }
        (SwanIndex::List, ValueKind::Elems(_)) => {
            with_buffer::<CsrStore<u8, Fp8E4M3>>(s, c, st, threads)
        }
        (SwanIndex::List, ValueKind::Int8) => {
            with_buffer::<CodedStore<L, Int8Values>>(s, c, st, threads)
        }
        (SwanIndex::List, ValueKind::Int4) => {
            with_buffer::<CodedStore<L, Int4Values>>(s, c, st, threads)
        }
        (SwanIndex::Bitmask, ValueKind::Elems(ValueFormat::F32)) => {
            with_buffer::<CodedStore<B, Elems<f32>>>(s, c, st, threads)
        }
        (SwanIndex::Bitmask, ValueKind::Elems(ValueFormat::F16)) => {
            with_buffer::<CodedStore<B, Elems<f16>>>(s, c, st, threads)
        }
        (SwanIndex::Bitmask, ValueKind::Elems(ValueFormat::Bf16)) => {
            with_buffer::<CodedStore<B, Elems<bf16>>>(s, c, st, threads)
        }
        (SwanIndex::Bitmask, ValueKind::Elems(_)) => {
            with_buffer::<CodedStore<B, Elems<Fp8E4M3>>>(s, c, st, threads)
        }
        (SwanIndex::Bitmask, ValueKind::Int8) => {
            with_buffer::<CodedStore<B, Int8Values>>(s, c, st, threads)
        }
        (SwanIndex::Bitmask, ValueKind::Int4) => {
            with_buffer::<CodedStore<B, Int4Values>>(s, c, st, threads)
        }
        (_, v) => Err(spec_err("swan", format!("value code {v} is not supported"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use projection::{Mat, Provenance};

    /// A calibrated set (bases with eigenvalues) takes a synthetic ring basis on some
    /// layers: the mixed set holds the ring's matrices there and the calibrated ones
    /// elsewhere.
    #[test]
    fn ring_layers_mix_into_a_calibrated_set() {
        let dims = ModelDims::new(3, 2, 1, 4).unwrap();
        let eig = |m: Mat| Basis::with_eigenvalues(m, vec![4.0, 3.0, 2.0, 1.0]).unwrap();
        let swap = Mat::from_fn(4, 4, |i, j| if i == 3 - j { 1.0 } else { 0.0 });
        let qk = (0..3).map(|_| eig(swap.clone())).collect();
        let vo = (0..3).map(|_| eig(swap.clone())).collect();
        let prov = Provenance {
            model: "toy".into(),
            calibration_tokens: 10,
            kind: BasisKind::Calibrated,
            config: None,
        };
        let calibrated = ProjectionSet::from_parts(dims, qk, vo, None, prov).unwrap();
        let ring = ProjectionSet::hadamard(ModelDims::new(3, 2, 1, 4).unwrap(), "toy").unwrap();
        let mixed = with_layers_of(&calibrated, &ring, &[0, 2]).unwrap();
        for layer in 0..3 {
            let from = if layer == 1 { &calibrated } else { &ring };
            for s in [Stream::Qk, Stream::Vo] {
                let got = mixed.basis(s, layer, 0).unwrap().matrix();
                assert_eq!(got, from.basis(s, layer, 0).unwrap().matrix(), "layer {layer}");
            }
        }
    }
}
