//! Fuzz harness for `projection`'s safetensors files ([`ProjectionSet::from_bytes`]).
//!
//! Oracle: bytes either give a typed error, or a set whose every basis is orthogonal
//! within [`ORTHOGONALITY_TOLERANCE`], that fits its own dims, rotates a key of every
//! layer while preserving its norm, has well-formed energy curves, and round-trips
//! through [`ProjectionSet::to_bytes`] unchanged. Any panic, abort or UB is a bug.
//!
//! Byte-level mutation rarely keeps the JSON header parseable, so
//! [`header_mutant`] also edits the header as JSON (shapes, dtypes, offsets,
//! metadata values) and re-frames it with a correct length prefix.

use projection::{
    CalibrationConfig, Calibrator, LayerActivations, ModelDims, ORTHOGONALITY_TOLERANCE,
    ProjectionSet, Stream,
};
use serde_json::Value as Json;

/// Parses `data` and, if it is accepted, exercises the set.
pub fn check(data: &[u8]) {
    match ProjectionSet::from_bytes(data) {
        Ok(set) => exercise(&set),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn exercise(set: &ProjectionSet) {
    let dims = set.dims();
    let err = set.max_orthogonality_error();
    assert!(err <= ORTHOGONALITY_TOLERANCE, "accepted a basis with error {err}");
    set.check_compatible(&dims, Some(&set.provenance().model)).expect("fits its own dims");
    let d = dims.head_dim();
    for layer in 0..dims.layers() {
        let mut k: Vec<f32> = (0..dims.kv_heads() * d).map(|i| (i % 5) as f32 - 2.0).collect();
        let before: f32 = k.iter().map(|x| x * x).sum();
        set.rotate_keys(layer, 1, &mut k).expect("rotate a key");
        let after: f32 = k.iter().map(|x| x * x).sum();
        assert!((after - before).abs() <= 1e-2 * before.max(1.0), "norm {before} -> {after}");
        for kv_head in 0..dims.kv_heads() {
            for stream in [Stream::Qk, Stream::Vo] {
                if let Some(curve) = set.energy_curve(stream, layer, kv_head).expect("in range") {
                    assert_eq!(curve.len(), d);
                }
            }
            set.counts(layer, kv_head).expect("in range");
            let qk = set.basis(Stream::Qk, layer, kv_head).expect("in range");
            if let Some(e) = qk.query_energy() {
                assert_eq!(e.len(), d);
                assert!(e.iter().all(|x| x.is_finite() && *x >= 0.0), "accepted energies {e:?}");
            }
        }
    }
    let bytes = set.to_bytes().expect("serialise an accepted set");
    let back = ProjectionSet::from_bytes(&bytes).expect("a re-serialised set parses");
    assert!(back == *set, "round trip changed the set:\n{set:?}\n{back:?}");
}

/// Splits a safetensors image into its JSON header and the data after it.
fn split(data: &[u8]) -> Option<(Json, &[u8])> {
    let n = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    let end = 8usize.checked_add(usize::try_from(n).ok()?)?;
    let header = serde_json::from_slice(data.get(8..end)?).ok()?;
    Some((header, &data[end..]))
}

/// Frames a JSON header and a data section as a safetensors image.
fn join(header: &Json, body: &[u8]) -> Vec<u8> {
    let text = header.to_string();
    let mut out = Vec::with_capacity(8 + text.len() + body.len());
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(body);
    out
}

/// `seed` with its JSON header edited by [`super::json::edit`]. `None` if `seed` is not a
/// safetensors image.
pub fn header_mutant(seed: &[u8], at: u64, choice: u64, remove: bool) -> Option<Vec<u8>> {
    let (mut header, body) = split(seed)?;
    super::json::edit(&mut header, at, choice, remove);
    Some(join(&header, body))
}

/// Every single-location header edit of `seed` with `choices` replacement values (for
/// seeding a corpus).
pub fn header_mutants(seed: &[u8], choices: u64) -> Vec<Vec<u8>> {
    (0..64)
        .flat_map(|at| (0..choices).filter_map(move |c| header_mutant(seed, at, c, false)))
        .collect()
}

/// Deterministic pseudo-random activations in `[-1, 1)`.
fn activations(n: usize, salt: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let x = (i.wrapping_mul(2_654_435_761) ^ salt.wrapping_mul(40_503)).rotate_left(7);
            (x % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn calibrated(dims: ModelDims) -> ProjectionSet {
    let mut cal = Calibrator::new(dims, CalibrationConfig::default()).expect("calibrator");
    let n = 12;
    let (q, kv) = (dims.q_heads() * dims.head_dim(), dims.kv_heads() * dims.head_dim());
    for layer in 0..dims.layers() {
        let salt = layer as u32;
        let (queries, keys) = (activations(n * q, salt), activations(n * kv, salt + 10));
        let (values, attn_out) = (activations(n * kv, salt + 20), activations(n * q, salt + 30));
        let acts = LayerActivations {
            n_tokens: n,
            queries: &queries,
            keys: &keys,
            values: &values,
            attn_out: &attn_out,
        };
        cal.observe_layer(layer, &acts).expect("observe");
    }
    cal.finish("tiny-calibrated").expect("finish calibration")
}

/// Valid files: identity, random, calibrated (eigenvalues, query energies, counts, weights,
/// config metadata) and every ablation kind, MHA and GQA.
pub fn seeds() -> Vec<Vec<u8>> {
    let gqa = ModelDims::new(2, 4, 2, 4).expect("dims");
    let mha = ModelDims::new(1, 2, 2, 3).expect("dims");
    let cal = calibrated(gqa);
    let sets = [
        ProjectionSet::identity(mha, "toy-mha").expect("identity"),
        ProjectionSet::random(gqa, "toy-gqa", 7).expect("random"),
        cal.layer_shuffle(3).expect("layer shuffle"),
        cal.head_shuffle(4).expect("head shuffle"),
        cal.kv_shuffle().expect("kv shuffle"),
        cal,
    ];
    sets.iter().map(|s| s.to_bytes().expect("serialise seed")).collect()
}
