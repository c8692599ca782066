//! SWAN Appendix A.1 as property tests: with random weights, shapes and GQA ratios, and
//! every kind of basis (calibrated and all ablations), rotation before pruning is lossless.
//! * Lemma 1: `q̂·k̂ᵀ = q·kᵀ` at every (head, query position, key position).
//! * Lemma 2: the layer output through `Ŵ_V`/`Ŵ_O` (with V bias, GQA-expanded) equals the
//!   original — and so does the run-time alternative (rotate `v`, rotate `ô` back).
//!
//! Run with `--nocapture` to see the largest errors observed.

mod common;

use std::cell::Cell;

use common::{LayerWeights, Mode, calibrate_on, forward, gaussian, max_abs, max_abs_diff};
use projection::{BasisKind, ModelDims, ProjectionSet};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;

#[derive(Clone, Debug)]
struct Case {
    kv: usize,
    group: usize,
    d: usize,
    hidden: usize,
    n: usize,
    bias: bool,
    layer: usize,
    kind: usize,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=4, 1usize..=4, prop::sample::select(vec![2usize, 4, 6, 8, 16, 32, 64]))
        .prop_flat_map(|(kv, group, d)| {
            (
                Just((kv, group, d)),
                4usize..=40,
                1usize..=24,
                any::<bool>(),
                0usize..2,
                0usize..6,
                any::<u64>(),
            )
        })
        .prop_map(|((kv, group, d), hidden, n, bias, layer, kind, seed)| Case {
            kv,
            group,
            d,
            hidden,
            n,
            bias,
            layer,
            kind,
            seed: seed % 1_000_000,
        })
}

/// The set to test: calibrated on the model's own activations, or one ablation of it.
fn bases_for(c: &Case, ws: &[LayerWeights], x: &[f32]) -> ProjectionSet {
    let calibrated = calibrate_on(ws, x, c.n, "lossless-test");
    let kind = match c.kind {
        0 => BasisKind::Calibrated,
        1 => BasisKind::Random { seed: c.seed },
        2 => BasisKind::Identity,
        3 => BasisKind::KvShuffle,
        4 => BasisKind::LayerShuffle { seed: c.seed },
        _ if c.kv > 1 => BasisKind::HeadShuffle { seed: c.seed },
        _ => BasisKind::Calibrated,
    };
    if kind == BasisKind::Calibrated { calibrated } else { calibrated.ablation(kind).unwrap() }
}

struct Errors {
    score_abs: f32,
    score_rel: f32,
    output_rel: f32,
}

fn check_case(c: &Case) -> Errors {
    let dims = ModelDims::new(2, c.kv * c.group, c.kv, c.d).unwrap();
    let ws: Vec<LayerWeights> =
        (0..2).map(|l| LayerWeights::random(dims, c.hidden, c.bias, c.seed * 10 + l * 5)).collect();
    let x = gaussian(c.n * c.hidden, 1.0, c.seed + 99);
    let set = bases_for(c, &ws, &x);
    let w = &ws[c.layer];
    let base = forward(w, &x, c.n, Mode::Dense);

    let mut absorbed = w.clone();
    set.absorb_value(c.layer, &mut absorbed.wv, c.hidden, absorbed.bv.as_deref_mut()).unwrap();
    set.absorb_output(c.layer, &mut absorbed.wo, c.hidden).unwrap();
    let rot = forward(&absorbed, &x, c.n, Mode::Absorbed(&set, c.layer));
    let runtime = forward(w, &x, c.n, Mode::Runtime(&set, c.layer));

    let (nq, nkv, d, n) = (dims.q_heads(), dims.kv_heads(), c.d, c.n);
    let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
    let (mut score_abs, mut score_rel) = (0.0f32, 0.0f32);
    for h in 0..nq {
        for t in 0..n {
            let qn = norm(&base.q[(t * nq + h) * d..][..d]);
            for s in 0..=t {
                let kn = norm(&base.k[(s * nkv + dims.kv_of(h)) * d..][..d]);
                let i = (h * n + t) * n + s;
                let err = (rot.scores[i] - base.scores[i]).abs();
                score_abs = score_abs.max(err);
                score_rel = score_rel.max(err / (qn * kn / (d as f32).sqrt()).max(1e-30));
            }
        }
    }
    let scale = max_abs(&base.y).max(1e-30);
    let output_rel =
        (max_abs_diff(&rot.y, &base.y) / scale).max(max_abs_diff(&runtime.y, &base.y) / scale);
    Errors { score_abs, score_rel, output_rel }
}

#[test]
fn lemma1_scores_and_lemma2_outputs_are_preserved() {
    let mut runner = TestRunner::new(common::config(256));
    let worst = Cell::new((0.0f32, 0.0f32, 0.0f32));
    runner
        .run(&case(), |c| {
            let e = check_case(&c);
            let (a, r, o) = worst.get();
            worst.set((a.max(e.score_abs), r.max(e.score_rel), o.max(e.output_rel)));
            prop_assert!(
                e.score_rel < 1e-5,
                "Lemma 1 violated: rel score error {} in {c:?}",
                e.score_rel
            );
            prop_assert!(
                e.output_rel < 1e-4,
                "Lemma 2 violated: rel output error {} in {c:?}",
                e.output_rel
            );
            Ok(())
        })
        .unwrap();
    let (a, r, o) = worst.get();
    eprintln!(
        "lossless: max |ŝ − s| = {a:.3e} (relative to ‖q‖‖k‖/√d: {r:.3e}); \
         max |ŷ − y| / max |y| = {o:.3e}"
    );
}

#[test]
fn smollm2_and_llama_shapes_are_lossless_at_real_head_dims() {
    // GQA group 3 with d_h 64 (SmolLM2-135M) and group 4 with d_h 128 (Llama-3.1-8B).
    for (kv, group, d) in [(3usize, 3usize, 64usize), (2, 4, 128)] {
        let c = Case { kv, group, d, hidden: 48, n: 20, bias: true, layer: 1, kind: 0, seed: 7 };
        let e = check_case(&c);
        eprintln!(
            "d_h {d} group {group}: rel score err {:.3e}, rel output err {:.3e}",
            e.score_rel, e.output_rel
        );
        assert!(e.score_rel < 1e-5 && e.output_rel < 1e-4, "{c:?}");
    }
}

#[test]
fn unabsorbed_v_or_o_breaks_equality() {
    // The test above can fail: absorbing only W_V (not W_O) changes the output.
    let c =
        Case { kv: 2, group: 2, d: 8, hidden: 16, n: 6, bias: true, layer: 0, kind: 1, seed: 3 };
    let dims = ModelDims::new(2, 4, 2, 8).unwrap();
    let ws: Vec<LayerWeights> =
        (0..2).map(|l| LayerWeights::random(dims, 16, true, 30 + l)).collect();
    let x = gaussian(c.n * 16, 1.0, 1);
    let set = bases_for(&c, &ws, &x);
    let base = forward(&ws[0], &x, c.n, Mode::Dense);
    let mut half = ws[0].clone();
    set.absorb_value(0, &mut half.wv, 16, half.bv.as_deref_mut()).unwrap();
    let rot = forward(&half, &x, c.n, Mode::Absorbed(&set, 0));
    assert!(max_abs_diff(&rot.y, &base.y) > 1e-2 * max_abs(&base.y));
}
