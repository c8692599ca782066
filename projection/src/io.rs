//! Safetensors persistence of a [`ProjectionSet`] (SWAN §4: bases are computed once,
//! offline, and loaded next to the model).
//!
//! File layout (all little-endian, row-major):
//!
//! | tensor | dtype | shape | content |
//! |---|---|---|---|
//! | `qk`, `vo` | F32 | `[layers, kv_heads, d, d]` | `P[i][j]` = component `i` of basis vector `j` |
//! | `qk.eigenvalues`, `vo.eigenvalues` | F64 | `[layers, kv_heads, d]` | calibrated sets only |
//! | `qk.query_energy` | F64 | `[layers, kv_heads, d]` | queries' mean energy per basis vector (optional) |
//! | `counts` | U64 | `[layers, kv_heads, 2, 2]` | `[stream][tokens, vectors]`, calibrated only |
//! | `weights` | F64 | `[layers, kv_heads, 2]` | total sample weight per stream, calibrated only |
//!
//! Metadata: `format = kvtide-projection`, `format_version`, `model`, `calibration_tokens`,
//! `kind`, `seed` (seeded kinds), `config` (JSON weighting, calibrated sets), `layers`,
//! `q_heads`, `kv_heads`, `head_dim`, and a human-readable `layout`. Loading validates all
//! of it (dtypes, shapes, finiteness, orthogonality) and [`ProjectionSet::load_for`] also
//! checks the set against the model it is about to be used with.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::basis::Basis;
use crate::calibrate::{CalibrationConfig, SampleCounts};
use crate::dims::{ModelDims, Stream};
use crate::error::{Error, Result};
use crate::mat::Mat;
use crate::set::{BasisKind, HeadCounts, ProjectionSet, Provenance};

/// Value of the `format` metadata key.
pub const FORMAT: &str = "kvtide-projection";
/// Value of the `format_version` metadata key written by this crate.
pub const FORMAT_VERSION: u32 = 1;
const LAYOUT: &str = "qk/vo[layer][kv_head] = d x d row-major f32, column j = basis vector j; \
rotate a row vector as x_hat = x . P";

fn format_err(reason: impl Into<String>) -> Error {
    Error::Format { reason: reason.into() }
}

fn tensor_name(stream: Stream) -> &'static str {
    match stream {
        Stream::Qk => "qk",
        Stream::Vo => "vo",
    }
}

impl ProjectionSet {
    /// Serialises the set to safetensors bytes (layout in the module docs).
    ///
    /// # Errors
    /// [`Error::Safetensors`] if the codec rejects the data (not expected).
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let set = ProjectionSet::random(ModelDims::new(2, 4, 2, 8)?, "toy", 1)?;
    /// let back = ProjectionSet::from_bytes(&set.to_bytes()?)?;
    /// assert_eq!(back, set);
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let (l, kv, d) = (self.dims().layers(), self.dims().kv_heads(), self.head_dim());
        let mut buffers: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for s in Stream::ALL {
            let bases = self.bases(s);
            let bytes =
                bases.iter().flat_map(|b| b.matrix().as_slice()).flat_map(|x| x.to_le_bytes());
            buffers.push((tensor_name(s).into(), Dtype::F32, vec![l, kv, d, d], bytes.collect()));
            if bases.iter().all(|b| b.eigenvalues().is_some()) {
                let ev = bases.iter().flat_map(|b| b.eigenvalues().unwrap_or_default());
                let bytes = ev.flat_map(|x| x.to_le_bytes()).collect();
                buffers.push((
                    format!("{}.eigenvalues", tensor_name(s)),
                    Dtype::F64,
                    vec![l, kv, d],
                    bytes,
                ));
            }
            if bases.iter().all(|b| b.query_energy().is_some()) {
                let e = bases.iter().flat_map(|b| b.query_energy().unwrap_or_default());
                let bytes = e.flat_map(|x| x.to_le_bytes()).collect();
                let name = format!("{}.query_energy", tensor_name(s));
                buffers.push((name, Dtype::F64, vec![l, kv, d], bytes));
            }
        }
        if let Some(counts) = self.all_counts() {
            let pairs = counts.iter().flat_map(|c| [c.qk, c.vo]);
            let ints = pairs.clone().flat_map(|s| [s.tokens, s.vectors]).flat_map(u64::to_le_bytes);
            buffers.push(("counts".into(), Dtype::U64, vec![l, kv, 2, 2], ints.collect()));
            let w = pairs.flat_map(|s| s.weight.to_le_bytes()).collect();
            buffers.push(("weights".into(), Dtype::F64, vec![l, kv, 2], w));
        }
        let views = buffers
            .iter()
            .map(|(n, dt, shape, b)| Ok((n.clone(), TensorView::new(*dt, shape.clone(), b)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(safetensors::serialize(views, Some(self.metadata()))?)
    }

    fn metadata(&self) -> HashMap<String, String> {
        let p = self.provenance();
        let d = self.dims();
        let mut m: HashMap<String, String> = [
            ("format", FORMAT.to_owned()),
            ("format_version", FORMAT_VERSION.to_string()),
            ("model", p.model.clone()),
            ("calibration_tokens", p.calibration_tokens.to_string()),
            ("kind", p.kind.name().to_owned()),
            ("layers", d.layers().to_string()),
            ("q_heads", d.q_heads().to_string()),
            ("kv_heads", d.kv_heads().to_string()),
            ("head_dim", d.head_dim().to_string()),
            ("layout", LAYOUT.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        if let Some(seed) = p.kind.seed() {
            m.insert("seed".into(), seed.to_string());
        }
        if let Some(cfg) = &p.config {
            m.insert("config".into(), serde_json::to_string(cfg).unwrap_or_default());
        }
        m
    }

    /// Parses and validates a set from safetensors bytes.
    ///
    /// # Errors
    /// [`Error::Safetensors`] for a corrupt or truncated buffer; [`Error::Format`] for
    /// missing/invalid metadata, tensors, dtypes or shapes; [`Error::NonFinite`] for NaN/∞;
    /// [`Error::NotOrthogonal`] for a basis that is not orthogonal.
    ///
    /// # Examples
    /// ```
    /// assert!(projection::ProjectionSet::from_bytes(b"not a safetensors file").is_err());
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let (_, header) = SafeTensors::read_metadata(bytes)?;
        let meta = header.metadata().clone().unwrap_or_default();
        let file = SafeTensors::deserialize(bytes)?;
        let reader = Reader { meta: &meta, file: &file };
        reader.check_format()?;
        let dims = reader.dims()?;
        let provenance = reader.provenance()?;
        let qk = reader.bases(Stream::Qk, &dims)?;
        let vo = reader.bases(Stream::Vo, &dims)?;
        let counts = reader.counts(&dims)?;
        ProjectionSet::from_parts(dims, qk, vo, counts, provenance)
    }

    /// Writes the set to `path` (via a temporary file in the same directory, then a rename,
    /// so a crash never leaves a half-written set under the final name).
    ///
    /// # Errors
    /// [`Error::Io`] if writing fails; as [`ProjectionSet::to_bytes`].
    ///
    /// # Examples
    /// ```
    /// use projection::{ModelDims, ProjectionSet};
    /// let dir = tempfile::tempdir().unwrap();
    /// let path = dir.path().join("smol.projection.safetensors");
    /// let dims = ModelDims::new(30, 9, 3, 64)?;
    /// ProjectionSet::identity(dims, "SmolLM2-135M")?.save(&path)?;
    /// let set = ProjectionSet::load_for(&path, &dims, Some("SmolLM2-135M"))?;
    /// assert!(ProjectionSet::load_for(&path, &dims, Some("Llama-3.1-8B")).is_err());
    /// # Ok::<(), projection::Error>(())
    /// ```
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let io = |op, source| Error::Io { op, path: path.to_owned(), source };
        std::fs::write(&tmp, bytes).map_err(|e| io("write", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("rename into", e))
    }

    /// Reads and validates a set (see [`ProjectionSet::from_bytes`]).
    ///
    /// # Errors
    /// [`Error::Io`] if the file cannot be read; as [`ProjectionSet::from_bytes`].
    ///
    /// # Examples
    /// ```
    /// assert!(projection::ProjectionSet::load("/nonexistent/p.safetensors").is_err());
    /// ```
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            op: "read",
            path: path.to_owned(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    /// Loads a set and checks it against the model it will be used with
    /// ([`ProjectionSet::check_compatible`]): same dims and, if given, model name.
    ///
    /// # Errors
    /// As [`ProjectionSet::load`], plus [`Error::Mismatch`] naming the differing field.
    ///
    /// # Examples
    /// See [`ProjectionSet::save`].
    pub fn load_for(path: impl AsRef<Path>, dims: &ModelDims, model: Option<&str>) -> Result<Self> {
        let set = Self::load(path)?;
        set.check_compatible(dims, model)?;
        Ok(set)
    }
}

/// Typed access to a parsed file's metadata and tensors.
struct Reader<'a> {
    meta: &'a HashMap<String, String>,
    file: &'a SafeTensors<'a>,
}

impl Reader<'_> {
    fn str(&self, key: &str) -> Result<&str> {
        self.meta
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| format_err(format!("missing metadata {key:?}")))
    }

    fn num<T: std::str::FromStr>(&self, key: &str) -> Result<T> {
        let s = self.str(key)?;
        s.parse().map_err(|_| format_err(format!("metadata {key:?} = {s:?} is not a number")))
    }

    fn check_format(&self) -> Result<()> {
        let format = self.str("format")?;
        if format != FORMAT {
            return Err(format_err(format!("format {format:?}, expected {FORMAT:?}")));
        }
        let version: u32 = self.num("format_version")?;
        if version != FORMAT_VERSION {
            return Err(format_err(format!("format_version {version}, expected {FORMAT_VERSION}")));
        }
        Ok(())
    }

    fn dims(&self) -> Result<ModelDims> {
        ModelDims::new(
            self.num("layers")?,
            self.num("q_heads")?,
            self.num("kv_heads")?,
            self.num("head_dim")?,
        )
    }

    fn provenance(&self) -> Result<Provenance> {
        let seed = match self.meta.get("seed") {
            Some(_) => Some(self.num("seed")?),
            None => None,
        };
        let kind = BasisKind::from_name(self.str("kind")?, seed)?;
        let config = match self.meta.get("config") {
            Some(json) => Some(
                serde_json::from_str::<CalibrationConfig>(json)
                    .map_err(|e| format_err(format!("metadata \"config\": {e}")))?,
            ),
            None => None,
        };
        Ok(Provenance {
            model: self.str("model")?.to_owned(),
            calibration_tokens: self.num("calibration_tokens")?,
            kind,
            config,
        })
    }

    /// Raw little-endian bytes of `name`, after checking its dtype and shape.
    fn raw(&self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<Option<&[u8]>> {
        let t = match self.file.tensor(name) {
            Ok(t) => t,
            Err(safetensors::SafeTensorError::TensorNotFound(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if t.dtype() != dtype || t.shape() != shape {
            return Err(format_err(format!(
                "tensor {name:?} is {:?} {:?}, expected {dtype:?} {shape:?}",
                t.dtype(),
                t.shape()
            )));
        }
        Ok(Some(t.data()))
    }

    fn required(&self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<&[u8]> {
        self.raw(name, dtype, shape)?.ok_or_else(|| format_err(format!("missing tensor {name:?}")))
    }

    fn bases(&self, stream: Stream, dims: &ModelDims) -> Result<Vec<Basis>> {
        let (l, kv, d) = (dims.layers(), dims.kv_heads(), dims.head_dim());
        let name = tensor_name(stream);
        let mats = self.required(name, Dtype::F32, &[l, kv, d, d])?;
        let floats: Vec<f32> =
            mats.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let ev_name = format!("{name}.eigenvalues");
        let eigen = self.raw(&ev_name, Dtype::F64, &[l, kv, d])?.map(le_f64);
        let energy_name = format!("{name}.query_energy");
        let energy = self.raw(&energy_name, Dtype::F64, &[l, kv, d])?.map(le_f64);
        floats
            .chunks_exact(d * d)
            .enumerate()
            .map(|(i, m)| {
                let mat = Mat::from_vec(d, d, m.to_vec())?;
                let basis = match &eigen {
                    Some(ev) => Basis::with_eigenvalues(mat, ev[i * d..(i + 1) * d].to_vec())?,
                    None => Basis::new(mat)?,
                };
                match &energy {
                    Some(e) => basis.with_query_energy(e[i * d..(i + 1) * d].to_vec()),
                    None => Ok(basis),
                }
            })
            .collect()
    }

    fn counts(&self, dims: &ModelDims) -> Result<Option<Vec<HeadCounts>>> {
        let (l, kv) = (dims.layers(), dims.kv_heads());
        let ints = self.raw("counts", Dtype::U64, &[l, kv, 2, 2])?;
        let weights = self.raw("weights", Dtype::F64, &[l, kv, 2])?;
        let (ints, weights) = match (ints, weights) {
            (None, None) => return Ok(None),
            (Some(i), Some(w)) => (le_u64(i), le_f64(w)),
            _ => {
                return Err(format_err(
                    "\"counts\" and \"weights\" must be both present or absent",
                ));
            }
        };
        // Sample weights are sums of non-negative finite weights; anything else is corrupt.
        if let Some(&value) = weights.iter().find(|w| !(w.is_finite() && **w >= 0.0)) {
            let op = "ProjectionSet::from_bytes";
            return Err(Error::InvalidWeight { op, what: "\"weights\" tensor", value });
        }
        let sample = |site: usize, s: usize| SampleCounts {
            tokens: ints[site * 4 + s * 2],
            vectors: ints[site * 4 + s * 2 + 1],
            weight: weights[site * 2 + s],
        };
        Ok(Some((0..l * kv).map(|i| HeadCounts { qk: sample(i, 0), vo: sample(i, 1) }).collect()))
    }
}

fn le_f64(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}

fn le_u64(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect()
}
