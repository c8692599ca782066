//! `examples/custom-runtime` (pure Rust: `projection` + `kv-sparse` + `attn-kernels`, no
//! libtorch) against the `models` forward (libtorch) on the tiny fixture checkpoints: decoding
//! the reference prompt token by token, every step's logits agree within 1e-4 in the lossless
//! setting (`k = head_dim`, f32 hybrid caches, identity or random SWAN bases) against the
//! `models` dense f32 cache.

use std::path::PathBuf;

use custom_runtime::{Decoder, Llama};
use kv_sparse::hybrid::HybridConfig;
use models::cache::{CacheShape, DenseCache};
use models::{Checkpoint, Session};
use projection::ProjectionSet;
use tch::Tensor;

const TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny").join(name)
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.flatten(0, -1)).expect("f32 logits")
}

#[test]
fn custom_runtime_logits_equal_the_models_forward() {
    let prompt: Vec<u32> = (0..24u32).map(|i| (i * 37 + 5) % 256).collect();
    for name in ["llama-gqa", "llama-mha"] {
        let dir = fixture(name);
        let ckpt = Checkpoint::load(&dir).unwrap();
        let cache = DenseCache::<f32>::new(CacheShape::of(&ckpt.config).unwrap(), 1).unwrap();
        let mut session = Session::new(ckpt.model.clone(), Box::new(cache)).unwrap();
        let mut want = vec![to_vec(&session.prefill(&prompt[..1]).unwrap())];
        for &id in &prompt[1..] {
            want.push(to_vec(&session.decode(id).unwrap()));
        }
        let dims = custom_runtime::LlamaConfig::load(&dir).unwrap().dims().unwrap();
        for set in [
            ProjectionSet::identity(dims, name).unwrap(),
            ProjectionSet::random(dims, name, 11).unwrap(),
        ] {
            let kind = set.kind();
            let model = Llama::load(&dir, set).unwrap();
            let cache = HybridConfig::lossless(dims.head_dim(), 4);
            let mut decoder = Decoder::<u8, f32, f32>::new(model, cache, 1).unwrap();
            for (t, &id) in prompt.iter().enumerate() {
                let got = decoder.step(id).unwrap();
                assert_eq!(got.len(), want[t].len());
                let err = got.iter().zip(&want[t]).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(err <= TOL, "{name} {kind} step {t}: max |Δ| {err:e}");
            }
        }
    }
}
