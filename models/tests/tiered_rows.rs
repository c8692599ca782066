//! The `swan+tiered` and `turbo+tiered` decode paths attend the store's resident rows where
//! they lie (WnW §2.3 with SWAN sparse fp8 or TurboQuant-style coded rows for non-anchor span
//! rows): on the tiny fixtures, every decode
//! step's attention output equals the `f64` reference over the same resident rows decoded
//! to f32 (what the cache once computed by decoding every sparse row each step) within the
//! kernel tolerance, the anchor-weights feedback (Eq. 2) makes WnW recall exactly the chunks
//! that reference's weights select, and the lossless setting still equals dense.

mod common;

use std::sync::Arc;

use attn_kernels::accuracy::{Kernel, tolerance};
use attn_kernels::{AttnConfig, DecodeAttention, GatheredKv, Reference};
use common::fixtures;
use kv_sparse::Value;
use models::cache::spec::{CacheKind, CacheSpec};
use models::cache::{
    AttentionRequest, CacheBytes, CacheShape, KvCache, LayerKv, SpanRows, StepQkv, TieredCache,
};
use models::{Checkpoint, Session};
use projection::ProjectionSet;
use tch::Tensor;

/// What a [`Checked`] cache saw over a run.
#[derive(Debug, Default)]
struct Seen {
    /// Largest output error relative to the largest value entry attended.
    out_err: f32,
    /// Decode calls checked.
    calls: usize,
    /// Steps whose chunk selection was checked (the others had a near-tie).
    selections: usize,
    /// Sparse rows attended, summed over calls.
    sparse_rows: usize,
}

/// A `swan+tiered` cache that checks every decode call against the reference over its own
/// store's resident rows, decoded to f32, and every step's recalls against the chunks the
/// reference's anchor weights select.
struct Checked<D: Value> {
    inner: TieredCache<D>,
    set: Arc<ProjectionSet>,
    cfg: AttnConfig,
    top_chunks: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    rows: Vec<(Vec<u32>, Vec<f32>, Vec<f32>)>,
    want: Vec<f32>,
    weights: Vec<f32>,
    /// This step's reference `A^{(s)}` over the span (anchor heads, all layers).
    anchor: Vec<f64>,
    seen: Arc<std::sync::Mutex<Seen>>,
}

impl<D: Value> Checked<D> {
    fn check_decode(&mut self, layer: usize, step: &StepQkv<'_>, out: &[f32]) {
        self.set.rotate_qk_into(layer, 1, step.q, step.k, &mut self.q, &mut self.k).unwrap();
        let store = self.inner.store().expect("decode after prefill");
        let mut sparse_rows = 0;
        {
            let view = store.layer_view(layer).unwrap();
            for (h, (p, k, v)) in self.rows.iter_mut().enumerate() {
                let head = view.head(h).unwrap();
                sparse_rows += head.sparse.positions.len();
                head.decode_into(p, k, v).unwrap();
            }
        }
        let d = self.cfg.head_dim();
        let list: Vec<GatheredKv<'_, f32>> =
            self.rows.iter().map(|(p, k, v)| GatheredKv::new(d, p, k, v)).collect();
        self.weights.resize(self.rows.iter().map(|r| r.0.len()).sum(), 0.0);
        Reference
            .gathered(&self.cfg, &self.q, &list, &mut self.want, Some(&mut self.weights))
            .unwrap();
        let bound = self.rows.iter().flat_map(|r| &r.2).fold(0f32, |m, v| m.max(v.abs()));
        let err = out.iter().zip(&self.want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)
            / bound.max(f32::MIN_POSITIVE);
        let format = store.config().rows.dense;
        let tol = tolerance(Kernel::GatheredSparse, format).output;
        assert!(err <= tol, "layer {layer}: output error {err:e} (tolerance {tol:e})");
        let span = store.config().layout.audio_span();
        let mut off = 0;
        for (h, (p, _, _)) in self.rows.iter().enumerate() {
            if store.is_anchor(layer, h) {
                for (i, &pos) in p.iter().enumerate() {
                    if span.contains(&(pos as usize)) {
                        self.anchor[pos as usize - span.start] += f64::from(self.weights[off + i]);
                    }
                }
            }
            off += p.len();
        }
        let mut seen = self.seen.lock().unwrap();
        seen.out_err = seen.out_err.max(err);
        seen.calls += 1;
        seen.sparse_rows += sparse_rows;
    }

    /// After `end_step`: every tidal head holds every recallable segment of the chunks the
    /// reference weights select (skipped when the last selected and the first unselected
    /// chunk are too close to call).
    fn check_selection(&mut self) {
        let store = self.inner.store().unwrap();
        let layout = store.config().layout;
        let mut chunks: Vec<(f64, usize)> = (0..layout.num_chunks())
            .map(|c| {
                let r = layout.chunk(c);
                (self.anchor[r.clone()].iter().sum::<f64>() / r.len() as f64, c)
            })
            .collect();
        self.anchor.fill(0.0);
        chunks.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let top = self.top_chunks.min(chunks.len());
        if top < chunks.len() && chunks[top - 1].0 - chunks[top].0 <= 1e-4 * chunks[top - 1].0 {
            return;
        }
        assert_eq!(store.last_step().failed_recalls, 0);
        let residency = store.residency();
        for &(_, c) in &chunks[..top] {
            for s in layout.chunk_segments(c) {
                for h in 0..store.config().total_kv_heads() {
                    if residency.recallable(h, s) {
                        assert!(residency.resident(h, s), "head {h} segment {s} (chunk {c})");
                    }
                }
            }
        }
        self.seen.lock().unwrap().selections += 1;
    }
}

impl<D: Value> KvCache for Checked<D> {
    fn label(&self) -> String {
        self.inner.label()
    }
    fn shape(&self) -> CacheShape {
        self.inner.shape()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn reserve(&mut self, tokens: usize) -> models::Result<()> {
        self.inner.reserve(tokens)
    }
    fn prefill(&mut self, layer: usize, kv: LayerKv<'_>) -> models::Result<()> {
        self.inner.prefill(layer, kv)
    }
    fn attention_request(&mut self, prompt_len: usize) -> Option<AttentionRequest> {
        self.inner.attention_request(prompt_len)
    }
    fn prefill_attention(&mut self, layer: usize, received: &[f32]) -> models::Result<()> {
        self.inner.prefill_attention(layer, received)
    }
    fn decode(&mut self, layer: usize, step: StepQkv<'_>, out: &mut [f32]) -> models::Result<()> {
        self.inner.decode(layer, step, out)?;
        self.check_decode(layer, &step, out);
        Ok(())
    }
    fn end_step(&mut self) -> models::Result<()> {
        self.inner.end_step()?;
        if self.inner.store().is_some_and(|s| s.policy().name() == "wnw") {
            self.check_selection();
        }
        Ok(())
    }
    fn bytes(&self) -> CacheBytes {
        self.inner.bytes()
    }
    fn stats(&self) -> Vec<(&'static str, f64)> {
        self.inner.stats()
    }
}

/// Scores `ids` through `spec`'s model with a [`Checked`] `swan+tiered` cache; returns the
/// logits of every decoded position, what the checks saw and the store's recalls.
fn run_checked<D: Value>(
    ckpt: &Checkpoint,
    spec: &str,
    ids: &[u32],
    prefix: usize,
) -> (Vec<Tensor>, Seen, f64) {
    let parsed: CacheSpec = spec.parse().unwrap();
    let (model, _) = parsed.build(&ckpt.model).unwrap();
    let shape = CacheShape::of(model.config()).unwrap();
    let (rows, set, tiered) = match &parsed.kind {
        CacheKind::SwanTiered(swan, tiered) => {
            let set = swan.projection(&ckpt.model).unwrap();
            (SpanRows::Swan(swan.config(shape.head_dim())), set, tiered)
        }
        CacheKind::CodedTiered(coded, tiered) => {
            (coded.span_rows(), coded.projection(&ckpt.model).unwrap().unwrap(), tiered)
        }
        _ => panic!("{spec}: not swan+tiered or turbo+tiered"),
    };
    let set = Arc::new(set);
    let inner = TieredCache::<D>::with_rows(shape, tiered.clone(), rows, Some(set.clone()), 1)
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let cache = Checked {
        inner,
        set,
        cfg: shape.attn,
        top_chunks: tiered.top_chunks,
        q: vec![0.0; shape.q_heads() * shape.head_dim()],
        k: vec![0.0; shape.kv_heads() * shape.head_dim()],
        rows: (0..shape.kv_heads()).map(|_| Default::default()).collect(),
        want: vec![0.0; shape.q_heads() * shape.head_dim()],
        weights: Vec::new(),
        anchor: vec![0.0; tiered.span(prefix).unwrap().len()],
        seen: seen.clone(),
    };
    let mut session = Session::new(model, Box::new(cache)).unwrap();
    let mut logits = Vec::new();
    let mut keep = |_: usize, l: &Tensor| {
        logits.push(l.copy());
        Ok(())
    };
    models::score(&mut session, ids, prefix, &mut keep, &mut |_| ()).unwrap();
    let recalls = session.cache().stats().into_iter().find(|s| s.0 == "recalls").unwrap().1;
    drop(session);
    let seen = Arc::try_unwrap(seen).unwrap().into_inner().unwrap();
    (logits, seen, recalls)
}

fn ids(ckpt: &Checkpoint, n: u32) -> Vec<u32> {
    (0..n).map(|i| (i * 37 + 11) % ckpt.config.vocab_size as u32).collect()
}

/// Sparse fp8 rows for tidal and fixed heads, dense anchors in each dense format; WnW's
/// chunk swap recalls sparse segments while the decode runs.
#[test]
fn sparse_rows_attend_in_place_like_the_reference_over_decoded_rows() {
    let base = "swan+tiered:k=8,kv=6,basis=random:4,span=4..68,segment=4,chunk=8,r_gpu=0.5,n_voice=3,n_anchor=1,top=2,threads=1";
    for (name, format) in [("llama-gqa", "f16"), ("llama-mha", "bf16"), ("qwen2", "f32")] {
        let ckpt = Checkpoint::load(&fixtures().join("tiny").join(name)).unwrap();
        let spec = format!("{base},format={format}");
        let ids = ids(&ckpt, 136);
        let (logits, seen, recalls) = match format {
            "f16" => run_checked::<half::f16>(&ckpt, &spec, &ids, 72),
            "bf16" => run_checked::<half::bf16>(&ckpt, &spec, &ids, 72),
            _ => run_checked::<f32>(&ckpt, &spec, &ids, 72),
        };
        println!("{name} {format}: {seen:?}, {recalls} recalls");
        assert!(logits.iter().all(|l| l.abs().max().double_value(&[]).is_finite()), "{name}");
        assert_eq!(seen.calls, 2 * (136 - 72 - 1), "{name}: every layer of every step checked");
        assert!(seen.sparse_rows > 0, "{name}: sparse rows must be attended");
        assert!(recalls > 0.0, "{name}: the anchor feedback must drive recalls");
        assert!(seen.selections * 2 > 136 - 72, "{name}: too few selections checked: {seen:?}");
    }
}

/// TurboQuant-style coded rows (3-bit codebook keys and values; QJL keys at 3 bits) for
/// tidal and fixed heads: every decode step equals the reference over the same resident
/// rows decoded, and the anchor feedback drives the same recalls.
#[test]
fn coded_rows_attend_in_place_like_the_reference_over_decoded_rows() {
    let base = "turbo+tiered:bits=3,span=4..68,segment=4,chunk=8,r_gpu=0.5,n_voice=3,n_anchor=1,top=2,threads=1";
    for (name, extra) in [("llama-gqa", ",format=f16"), ("qwen2", ",format=f32,qjl=on")] {
        let ckpt = Checkpoint::load(&fixtures().join("tiny").join(name)).unwrap();
        let spec = format!("{base}{extra}");
        let ids = ids(&ckpt, 136);
        let (logits, seen, recalls) = if extra.contains("f16") {
            run_checked::<half::f16>(&ckpt, &spec, &ids, 72)
        } else {
            run_checked::<f32>(&ckpt, &spec, &ids, 72)
        };
        println!("{name} {extra}: {seen:?}, {recalls} recalls");
        assert!(logits.iter().all(|l| l.abs().max().double_value(&[]).is_finite()), "{name}");
        assert_eq!(seen.calls, 2 * (136 - 72 - 1), "{name}: every layer of every step checked");
        assert!(seen.sparse_rows > 0, "{name}: coded rows must be attended");
        assert!(recalls > 0.0, "{name}: the anchor feedback must drive recalls");
        assert!(seen.selections * 2 > 136 - 72, "{name}: too few selections checked: {seen:?}");
    }
    for bad in ["turbo+tiered:bits=3,span=4..8,b=16", "kivi+tiered:span=4..8"] {
        let err = bad.parse::<CacheSpec>().unwrap_err().to_string();
        assert!(err.contains("tiered"), "{bad}: {err}");
    }
}

/// The lossless `swan+tiered` setting (every component kept, f32, retention 1, δ = ∞) runs
/// the same path and still equals the dense cache.
#[test]
fn lossless_swan_tiered_equals_dense() {
    for name in ["llama-gqa", "qwen2"] {
        let ckpt = Checkpoint::load(&fixtures().join("tiny").join(name)).unwrap();
        let ids = ids(&ckpt, 48);
        let d = ckpt.config.head_dim;
        let spec = format!(
            "swan+tiered:k={d},value=f32,buffer=f32,basis=random:5,span=4..20,segment=4,chunk=8,format=f32,lossless,threads=1"
        );
        let (tiered, seen, _) = run_checked::<f32>(&ckpt, &spec, &ids, 24);
        assert_eq!(seen.sparse_rows, 0, "{name}: lossless rows stay dense");
        let dense_spec: CacheSpec = "dense:format=f32,threads=1".parse().unwrap();
        let (model, cache) = dense_spec.build(&ckpt.model).unwrap();
        let mut session = Session::new(model, cache).unwrap();
        let mut dense = Vec::new();
        let mut keep = |_: usize, l: &Tensor| {
            dense.push(l.copy());
            Ok(())
        };
        models::score(&mut session, &ids, 24, &mut keep, &mut |_| ()).unwrap();
        assert_eq!(dense.len(), tiered.len());
        for (p, (a, b)) in dense.iter().zip(&tiered).enumerate() {
            assert_eq!(a.argmax(0, false).int64_value(&[]), b.argmax(0, false).int64_value(&[]));
            let err = (a - b).abs().max().double_value(&[]);
            assert!(err <= 1e-3, "{name}: step {p}: logits differ by {err:e}");
        }
    }
}
