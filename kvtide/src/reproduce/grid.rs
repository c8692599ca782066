//! The experiment grids of `kvtide reproduce`, as data: which cache configurations run on
//! which text, in the full run and in the CI-sized `--quick` run.
//!
//! SWAN (`papers/swan.txt` §6, Table 1–3, Figure 2): a factorial subset like the paper's —
//! * main grid, calibrated basis: retention `k/d_h ∈ {1.0, 0.75, 0.5, 0.3}` × values
//!   {16-bit (f16), fp8 at the *same memory budget* (`k' = ⌊3k/2⌋`, see
//!   [`super::memory::fp8_equal_budget_k`])} × buffer `b ∈ {0, 64, 128}`;
//! * projection ablation (Table 3) at `k/d_h = 0.5`, f16 values, `b = 0`: calibrated, random
//!   orthogonal, identity, layer-shuffle, head-shuffle, KV-shuffle;
//! * key/value split (Table 2) at `b = 0`, f16 values, calibrated:
//!   `(k_key/d, k_value/d) ∈ {(0.3, 0.7), (0.5, 0.5), (0.7, 0.3)}`;
//! * baselines dense f16 (the paper's uncompressed reference) and dense f32, and the
//!   lossless setting `k = d_h` with f32 values and buffer (random basis) checked against
//!   dense f32.
//!
//! `b = 0` isolates the sparse history in both ablations, as the paper's K/V study does.
//! fp8 values are stored unscaled (`scale=none`): calibration records SmolLM2's largest
//! |k| and |v|, far inside E4M3's ±448.
//!
//! WnW (`papers/wnw.txt` §3.4–3.9): Full, Ada-KV (static prefill top-k), AudioKV, ArkVale
//! and WnW at `r_GPU ∈ {0.8, 0.6, 0.4, 0.2}`, WnW with SWAN sparse fp8 rows, A1 (n_voice
//! sweep at r_GPU 0.1 and 0.2), A3 (VS×HS vs VS vs HS at r_GPU 0.1). The paper's voice-head
//! counts for Voxtral's 240 KV-heads, `{30, 30, 50, 90}` at `r_GPU {0.8, 0.6, 0.4, 0.2}` and
//! `{10, 30, 50, 70, 90}` in A1, are scaled to SmolLM2's 90 KV-heads (× 90/240, rounded,
//! at least one tidal head beside the 5 anchors).

use serde::Serialize;

use super::corpus::Variant;
use super::frontier::Code;
use super::memory::{fp8_equal_budget_k, retained_k};

/// Which part of the SWAN study a run belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SwanGroup {
    /// Dense references.
    Baseline,
    /// `k = d_h`, f32: must equal dense f32.
    Lossless,
    /// Retention × format × buffer.
    Main,
    /// Basis ablation.
    Projection,
    /// Key/value budget split.
    KvSplit,
}

/// One SWAN cache configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SwanRun {
    /// Group.
    pub group: SwanGroup,
    /// Nominal retention `k/d_h` (of the 16-bit point it is paired with).
    pub retention: f64,
    /// Kept key components (`None` for dense).
    pub k_key: Option<usize>,
    /// Kept value components.
    pub k_value: Option<usize>,
    /// Value code ([`Code::F16`], [`Code::Fp8`], [`Code::F32`]; a dense reference's format).
    pub values: Code,
    /// Dense buffer rows.
    pub buffer: usize,
    /// Basis name as the cache spec takes it.
    pub basis: String,
}

impl SwanRun {
    /// The cache spec (`proj` is the calibrated projection file).
    pub fn spec(&self, proj: &str, threads: usize) -> String {
        match (self.k_key, self.k_value) {
            (Some(k), Some(kv)) => {
                let buffer = if self.values == Code::F32 { "f32" } else { "f16" };
                format!(
                    "swan:k={k},kv={kv},b={},value={},buffer={buffer},scale=none,basis={},proj={proj},threads={threads}",
                    self.buffer, self.values, self.basis
                )
            }
            _ => format!("dense:format={},threads={threads}", self.values),
        }
    }

    /// A short label for tables and legends.
    pub fn label(&self) -> String {
        match (self.k_key, self.k_value) {
            (Some(k), Some(kv)) if k == kv => {
                format!("swan k={k} {} b={} {}", self.values, self.buffer, self.basis)
            }
            (Some(k), Some(kv)) => {
                format!("swan k={k}/{kv} {} b={} {}", self.values, self.buffer, self.basis)
            }
            _ => format!("dense {}", self.values),
        }
    }
}

/// Placement policies compared in the WnW study.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Method {
    /// Everything resident (tiered store, policy `full`).
    Full,
    /// Ada-KV: static prefill top-k with adaptive head budgets.
    AdaKv,
    /// AudioKV: static top-k with voice-score budgets and FFT-smoothed scores.
    AudioKv,
    /// ArkVale: page recall by query-box bounds.
    ArkVale,
    /// WnW.
    Wnw,
    /// WnW with SWAN sparse fp8 rows for non-anchor span rows.
    WnwSwan,
    /// AffPool: adjacent similar span tokens pooled into one row at prefill (Table 1).
    AffPool,
}

impl Method {
    /// The methods the main comparison runs at every target besides the Full cache, in
    /// table order.
    pub const COMPARED: [Method; 6] = [
        Method::AdaKv,
        Method::AudioKv,
        Method::ArkVale,
        Method::AffPool,
        Method::Wnw,
        Method::WnwSwan,
    ];

    /// Display name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "Full cache",
            Self::AdaKv => "Ada-KV (static top-k)",
            Self::AudioKv => "AudioKV",
            Self::ArkVale => "ArkVale",
            Self::Wnw => "WnW",
            Self::WnwSwan => "WnW + SWAN rows",
            Self::AffPool => "AffPool (token merging)",
        }
    }

    /// Short key for file names.
    pub fn key(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::AdaKv => "adakv",
            Self::AudioKv => "audiokv",
            Self::ArkVale => "arkvale",
            Self::Wnw => "wnw",
            Self::WnwSwan => "wnw_swan",
            Self::AffPool => "affpool",
        }
    }
}

/// Which head-ranking signal a WnW run triages with (ablation A3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Signal {
    /// VS × HS.
    VsHs,
    /// VS only.
    Vs,
    /// HS only.
    Hs,
}

/// WnW hyper-parameters a run may move off the paper's defaults (ablation A2 and the
/// Appendix C sweeps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WnwKnobs {
    /// Global top-k prefill quota instead of per-segment (A2).
    pub global_quota: bool,
    /// Chunks selected per step (3).
    pub top: usize,
    /// Eviction lag δ (3; `None`: ∞).
    pub delta: Option<u32>,
    /// Segment (stride) length in tokens (25).
    pub segment: usize,
    /// Chunk length in tokens (50).
    pub chunk: usize,
}

impl Default for WnwKnobs {
    fn default() -> Self {
        Self { global_quota: false, top: 3, delta: Some(3), segment: 25, chunk: 50 }
    }
}

impl WnwKnobs {
    /// The spec keys of the knobs that differ from the defaults (`,key=value…`).
    pub fn spec_suffix(&self) -> String {
        let d = Self::default();
        let mut out = String::new();
        if self.global_quota {
            out.push_str(",quota=global");
        }
        if self.top != d.top {
            out.push_str(&format!(",top={}", self.top));
        }
        if self.delta != d.delta {
            match self.delta {
                Some(x) => out.push_str(&format!(",delta={x}")),
                None => out.push_str(",delta=inf"),
            }
        }
        if (self.segment, self.chunk) != (d.segment, d.chunk) {
            out.push_str(&format!(",segment={},chunk={}", self.segment, self.chunk));
        }
        out
    }
}

/// One WnW-study configuration.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WnwRun {
    /// Which table it feeds (`main`, `a1`, `a3`).
    pub study: &'static str,
    /// Policy.
    pub method: Method,
    /// Target r_GPU (1.0 for Full).
    pub r_gpu: f64,
    /// Voice heads (WnW).
    pub n_voice: usize,
    /// Ranking signal (WnW).
    pub signal: Signal,
    /// Hyper-parameters off the defaults.
    pub knobs: WnwKnobs,
}

/// How big a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Size {
    /// CI-sized: a few points of every grid, short texts (minutes on 2 cores).
    Quick,
    /// Most of the full grids on the quick run's short texts (under an hour on one
    /// busy core): SWAN retentions {1.0, 0.5, 0.3} × buffers {0, 128} × formats, every
    /// basis and K/V split; WnW at r_GPU {0.8, 0.4, 0.2}.
    Reduced,
    /// The full grids and text lengths (hours on a 2-core CPU).
    Full,
}

impl Size {
    /// Name used in headings and scratch paths.
    pub fn name(self) -> &'static str {
        match self {
            Self::Quick => "quick",
            Self::Reduced => "reduced",
            Self::Full => "full",
        }
    }
}

/// Everything one run of `kvtide reproduce` does.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// CI-sized run.
    pub quick: bool,
    /// Run size.
    pub size: Size,
    /// Attention threads per cache.
    pub threads: usize,
    /// Calibration windows per SWAN calibration play, and their length.
    pub swan_calibration: (usize, usize),
    /// Evaluation windows of the SWAN eval play, their length and the prefilled prefix.
    pub swan_eval: (usize, usize, usize),
    /// SWAN configurations.
    pub swan: Vec<SwanRun>,
    /// Passage length of the WnW evaluation, and the eval plays used.
    pub wnw_passage: usize,
    /// Eval plays used.
    pub wnw_plays: Vec<&'static str>,
    /// Calibration passage length, plays, and HS answer groups.
    pub wnw_calibration: (usize, Vec<&'static str>, usize),
    /// Anchors.
    pub n_anchor: usize,
    /// WnW-study configurations.
    pub wnw: Vec<WnwRun>,
    /// Calibration decodes per configuration for the closed-loop budget (0: the policy's
    /// knob is the target itself, open loop).
    pub closed_loop: usize,
    /// Premise measurements: variant, passage length, plays.
    pub premise: Vec<(Variant, usize, Vec<&'static str>)>,
    /// Audio: new tokens per run, r_GPU targets.
    pub audio: (usize, Vec<f64>),
    /// Frontier-study configurations.
    pub frontier: Vec<super::frontier::FrontierRun>,
    /// Frontier evaluation windows, their length and prefix.
    pub frontier_eval: (usize, usize, usize),
}

/// Voice heads scaled from the paper's Voxtral count (of 240) to `heads`, ≥ `n_anchor + 1`.
///
/// # Examples
/// ```
/// use kvtide::reproduce::grid::scaled_n_voice;
/// assert_eq!(scaled_n_voice(90, 90, 5), 34);
/// assert_eq!(scaled_n_voice(10, 90, 5), 6);
/// ```
pub fn scaled_n_voice(paper: usize, heads: usize, n_anchor: usize) -> usize {
    ((paper * heads) as f64 / 240.0).round().max((n_anchor + 1) as f64).min(heads as f64) as usize
}

/// The paper's n_voice at each r_GPU of the main comparison (Voxtral, §3.4).
fn paper_n_voice(r: f64) -> usize {
    if r <= 0.2 + 1e-9 {
        90
    } else if r <= 0.4 + 1e-9 {
        50
    } else {
        30
    }
}

fn swan_main(head_dim: usize, retentions: &[f64], buffers: &[usize]) -> Vec<SwanRun> {
    let mut runs = Vec::new();
    for &r in retentions {
        let k = retained_k(r, head_dim);
        for &b in buffers {
            for (values, kk) in [(Code::F16, k), (Code::Fp8, fp8_equal_budget_k(k, head_dim))] {
                let run = SwanRun {
                    group: SwanGroup::Main,
                    retention: r,
                    k_key: Some(kk),
                    k_value: Some(kk),
                    values,
                    buffer: b,
                    basis: "calibrated".into(),
                };
                if !runs.iter().any(|x: &SwanRun| x.spec("", 1) == run.spec("", 1)) {
                    runs.push(run);
                }
            }
        }
    }
    runs
}

fn swan_ablations(head_dim: usize, bases: &[&str], splits: &[(f64, f64)]) -> Vec<SwanRun> {
    let k = retained_k(0.5, head_dim);
    let proj = bases.iter().map(|b| SwanRun {
        group: SwanGroup::Projection,
        retention: 0.5,
        k_key: Some(k),
        k_value: Some(k),
        values: Code::F16,
        buffer: 0,
        basis: (*b).to_owned(),
    });
    let split = splits.iter().map(|&(a, b)| SwanRun {
        group: SwanGroup::KvSplit,
        retention: 0.5,
        k_key: Some(retained_k(a, head_dim)),
        k_value: Some(retained_k(b, head_dim)),
        values: Code::F16,
        buffer: 0,
        basis: "calibrated".into(),
    });
    proj.chain(split).collect()
}

fn swan_references(head_dim: usize) -> Vec<SwanRun> {
    let dense = |values| SwanRun {
        group: SwanGroup::Baseline,
        retention: 1.0,
        k_key: None,
        k_value: None,
        values,
        buffer: 0,
        basis: String::new(),
    };
    let lossless = SwanRun {
        group: SwanGroup::Lossless,
        retention: 1.0,
        k_key: Some(head_dim),
        k_value: Some(head_dim),
        values: Code::F32,
        buffer: 0,
        basis: "random:7".into(),
    };
    vec![dense(Code::F16), dense(Code::F32), lossless]
}

const BASES: [&str; 6] =
    ["calibrated", "random:7", "identity", "layer-shuffle:7", "head-shuffle:7", "kv-shuffle"];
const SPLITS: [(f64, f64); 3] = [(0.3, 0.7), (0.5, 0.5), (0.7, 0.3)];

/// How many values of each Appendix C parameter (δ, top chunks, chunk length) the sweep runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SweepSize {
    /// Every value the paper's Table 7 style sweep takes.
    Every,
    /// The first value of each parameter: every sweep path decoded once, at CI cost.
    OnePerParameter,
}

fn wnw_runs(
    heads: usize,
    n_anchor: usize,
    targets: &[f64],
    a1: (&[usize], &[f64]),
    a3_r: f64,
    sweep: SweepSize,
) -> Vec<WnwRun> {
    let nv = |paper| scaled_n_voice(paper, heads, n_anchor);
    let mut runs = vec![WnwRun {
        study: "main",
        method: Method::Full,
        r_gpu: 1.0,
        n_voice: 0,
        signal: Signal::VsHs,
        knobs: WnwKnobs::default(),
    }];
    for &r in targets {
        for method in Method::COMPARED {
            runs.push(WnwRun {
                study: "main",
                method,
                r_gpu: r,
                n_voice: nv(paper_n_voice(r)),
                signal: Signal::VsHs,
                knobs: WnwKnobs::default(),
            });
        }
    }
    for &r in a1.1 {
        for &p in a1.0 {
            runs.push(WnwRun {
                study: "a1",
                method: Method::Wnw,
                r_gpu: r,
                n_voice: nv(p),
                signal: Signal::VsHs,
                knobs: WnwKnobs::default(),
            });
        }
    }
    for signal in [Signal::VsHs, Signal::Vs, Signal::Hs] {
        runs.push(WnwRun {
            study: "a3",
            method: Method::Wnw,
            r_gpu: a3_r,
            n_voice: nv(30),
            signal,
            knobs: WnwKnobs::default(),
        });
    }
    // A2: the same budget by a global top-k instead of per-segment quotas (the per-segment
    // runs are the main comparison's).
    for &r in targets.iter().filter(|&&r| (r - 0.2).abs() < 1e-9 || (r - 0.4).abs() < 1e-9) {
        runs.push(WnwRun {
            study: "a2",
            method: Method::Wnw,
            r_gpu: r,
            n_voice: nv(paper_n_voice(r)),
            signal: Signal::VsHs,
            knobs: WnwKnobs { global_quota: true, ..WnwKnobs::default() },
        });
    }
    // Appendix C sensitivity at r_GPU 0.2: δ, top chunks, chunk / stride lengths (the
    // defaults are the main comparison's WnW run).
    let d = WnwKnobs::default();
    let per_parameter: [Vec<WnwKnobs>; 3] = [
        [Some(1), Some(5), None].map(|delta| WnwKnobs { delta, ..d }).to_vec(),
        [1, 5].map(|top| WnwKnobs { top, ..d }).to_vec(),
        [(12, 24), (50, 100)].map(|(segment, chunk)| WnwKnobs { segment, chunk, ..d }).to_vec(),
    ];
    let values = match sweep {
        SweepSize::Every => usize::MAX,
        SweepSize::OnePerParameter => 1,
    };
    let sweep = per_parameter.into_iter().flat_map(|p| p.into_iter().take(values));
    if targets.iter().any(|&r| (r - 0.2).abs() < 1e-9) {
        for knobs in sweep {
            runs.push(WnwRun {
                study: "sweep",
                method: Method::Wnw,
                r_gpu: 0.2,
                n_voice: nv(paper_n_voice(0.2)),
                signal: Signal::VsHs,
                knobs,
            });
        }
    }
    runs
}

impl Plan {
    /// The plan of a run of `size` for a model with `heads` KV-heads in total and head
    /// width `head_dim`.
    pub fn new(size: Size, head_dim: usize, heads: usize) -> Self {
        match size {
            Size::Quick => Self::quick(head_dim, heads),
            Size::Reduced => Self::reduced(head_dim, heads),
            Size::Full => Self::full(head_dim, heads),
        }
    }

    /// Drops the ablations a model with `kv_heads` kv-heads per layer cannot run: with one,
    /// the head-shuffled basis (Table 3: bases permuted among a layer's kv-heads) is the
    /// calibrated basis itself, and building it is refused.
    pub fn fit_kv_heads(&mut self, kv_heads: usize) {
        if kv_heads < 2 {
            self.swan.retain(|r| !r.basis.starts_with("head-shuffle"));
        }
    }

    /// The frontier grid and windows of a model that joins the study besides the run's own
    /// (Gemma 3): the quick and full sizes as for every model; the reduced size covers
    /// k ∈ {d_h/8, d_h/4, d_h/2, d_h} at b = 128 on one window of 768 tokens with the second
    /// half scored (a larger model with a 262 144-row output layer: about as many
    /// multiply-adds as the reduced SmolLM2 leg).
    pub fn further_model_frontier(&mut self, head_dim: usize) {
        if self.size == Size::Reduced {
            self.frontier = super::frontier::grid(head_dim, &[1, 2, 4, 8], &[128], false);
            self.frontier_eval = (1, 768, 384);
        }
    }

    /// The reduced plan: the quick run's texts, most of the full grids.
    fn reduced(head_dim: usize, heads: usize) -> Self {
        let quick = Self::quick(head_dim, heads);
        let mut swan = swan_references(head_dim);
        swan.extend(swan_main(head_dim, &[1.0, 0.5, 0.3], &[0, 128]));
        swan.extend(swan_ablations(head_dim, &BASES, &SPLITS));
        let (n_anchor, a3) = (quick.n_anchor, 0.1);
        Self {
            quick: false,
            size: Size::Reduced,
            swan,
            swan_eval: (1, 272, 16),
            wnw: wnw_runs(
                heads,
                n_anchor,
                &[0.8, 0.4, 0.2],
                (&[30, 90], &[0.1]),
                a3,
                SweepSize::Every,
            ),
            closed_loop: 5,
            frontier: super::frontier::grid(head_dim, &[1, 2, 3, 4], &[128], false),
            frontier_eval: (1, 1024, 512),
            ..quick
        }
    }

    /// The CI-sized plan.
    fn quick(head_dim: usize, heads: usize) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n_anchor = 5;
        {
            let mut swan = swan_references(head_dim);
            swan.extend(swan_main(head_dim, &[1.0, 0.3], &[0, 64]));
            swan.extend(swan_ablations(
                head_dim,
                &["calibrated", "random:7", "identity"],
                &[(0.3, 0.7), (0.7, 0.3)],
            ));
            Self {
                quick: true,
                size: Size::Quick,
                threads,
                swan_calibration: (1, 512),
                swan_eval: (1, 192, 16),
                swan,
                wnw_passage: 500,
                wnw_plays: vec!["hamlet"],
                wnw_calibration: (120, vec!["coriolanus"], 2),
                n_anchor,
                wnw: wnw_runs(
                    heads,
                    n_anchor,
                    &[0.2],
                    (&[30, 90], &[0.1]),
                    0.1,
                    SweepSize::OnePerParameter,
                ),
                closed_loop: 4,
                premise: vec![(Variant::Chat, 500, vec!["hamlet"])],
                audio: (12, vec![0.4]),
                frontier: super::frontier::grid(head_dim, &[2, 4], &[64], false),
                frontier_eval: (1, 192, 96),
            }
        }
    }

    /// The full plan.
    fn full(head_dim: usize, heads: usize) -> Self {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n_anchor = 5;
        let mut swan = swan_references(head_dim);
        swan.extend(swan_main(head_dim, &[1.0, 0.75, 0.5, 0.3], &[0, 64, 128]));
        swan.extend(swan_ablations(head_dim, &BASES, &SPLITS));
        Self {
            quick: false,
            size: Size::Full,
            threads,
            swan_calibration: (2, 1024),
            swan_eval: (9, 1024, 32),
            swan,
            wnw_passage: 1000,
            wnw_plays: vec!["hamlet", "macbeth", "the-tempest"],
            wnw_calibration: (
                500,
                vec!["coriolanus", "much-ado-about-nothing", "the-merchant-of-venice"],
                8,
            ),
            n_anchor,
            wnw: wnw_runs(
                heads,
                n_anchor,
                &[0.8, 0.6, 0.4, 0.2],
                (&[10, 30, 50, 70, 90], &[0.1, 0.2]),
                0.1,
                SweepSize::Every,
            ),
            closed_loop: 6,
            premise: [Variant::Bare, Variant::Chat]
                .into_iter()
                .flat_map(|v| [500, 1500].map(|n| (v, n, vec!["hamlet", "macbeth", "the-tempest"])))
                .collect(),
            audio: (48, vec![0.8, 0.6, 0.4, 0.3]),
            frontier: super::frontier::grid(
                head_dim,
                &[1, 2, 3, 4, 5, 6, 7, 8],
                &[0, 64, 128],
                true,
            ),
            frontier_eval: (8, 1024, 512),
        }
    }

    /// SWAN runs deduplicated by spec (the projection and K/V studies share points with
    /// the main grid).
    pub fn unique_swan(&self) -> Vec<&SwanRun> {
        let mut out: Vec<&SwanRun> = Vec::new();
        for r in &self.swan {
            if !out.iter().any(|x| x.spec("", 1) == r.spec("", 1)) {
                out.push(r);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_kv_head_per_layer_drops_only_the_head_shuffle() {
        let mut p = Plan::new(Size::Reduced, 256, 18);
        let before = p.swan.len();
        p.fit_kv_heads(3);
        assert_eq!(p.swan.len(), before);
        p.fit_kv_heads(1);
        assert_eq!(p.swan.len(), before - 1);
        assert!(p.swan.iter().all(|r| !r.basis.starts_with("head-shuffle")));
        assert!(p.swan.iter().any(|r| r.basis.starts_with("layer-shuffle")));
    }

    #[test]
    fn full_grid_covers_the_issue() {
        let p = Plan::new(Size::Full, 64, 90);
        let main: Vec<_> = p.swan.iter().filter(|r| r.group == SwanGroup::Main).collect();
        // 4 retentions × 3 buffers × {f16, fp8}, minus fp8 duplicates where k' caps at d_h.
        assert_eq!(main.len(), 21);
        assert!(
            main.iter().any(|r| r.values == Code::Fp8 && r.k_key == Some(28) && r.buffer == 128)
        );
        assert_eq!(p.swan.iter().filter(|r| r.group == SwanGroup::Projection).count(), 6);
        assert_eq!(p.swan.iter().filter(|r| r.group == SwanGroup::KvSplit).count(), 3);
        // Shared points run once.
        assert_eq!(p.unique_swan().len(), 3 + 21 + 5 + 2);
        assert_eq!(p.swan_eval.0 * (p.swan_eval.1 - p.swan_eval.2), 8928);
        let wnw_main = p.wnw.iter().filter(|r| r.study == "main").count();
        assert_eq!(wnw_main, 1 + 4 * 6);
        assert_eq!(p.wnw.iter().filter(|r| r.study == "a1").count(), 10);
        // A2 at r_GPU 0.2 and 0.4; δ ∈ {1, 5, ∞}, top ∈ {1, 5}, two chunk sizes besides the
        // defaults.
        assert_eq!(p.wnw.iter().filter(|r| r.study == "a2").count(), 2);
        assert!(p.wnw.iter().filter(|r| r.study == "a2").all(|r| r.knobs.global_quota));
        assert_eq!(p.wnw.iter().filter(|r| r.study == "sweep").count(), 7);
        assert!(p.closed_loop > 0);
        assert!(p.wnw.iter().all(|r| r.method == Method::Full || r.n_voice > p.n_anchor));
    }

    #[test]
    fn reduced_grid_keeps_every_ablation_and_three_targets() {
        let (q, r) = (Plan::new(Size::Quick, 64, 90), Plan::new(Size::Reduced, 64, 90));
        assert!(q.quick && !r.quick && r.size == Size::Reduced);
        assert_eq!(r.swan.iter().filter(|x| x.group == SwanGroup::Projection).count(), 6);
        assert_eq!(r.swan.iter().filter(|x| x.group == SwanGroup::KvSplit).count(), 3);
        assert!(r.swan.iter().any(|x| x.buffer == 128 && x.values == Code::Fp8));
        let targets: Vec<f64> = r
            .wnw
            .iter()
            .filter(|x| x.study == "main" && x.method == Method::Wnw)
            .map(|x| x.r_gpu)
            .collect();
        assert_eq!(targets, [0.8, 0.4, 0.2]);
        // Longer windows than the largest buffer, same texts otherwise.
        assert!(r.swan_eval.1 - r.swan_eval.2 > 128);
        assert_eq!((r.wnw_passage, r.swan_calibration), (q.wnw_passage, q.swan_calibration));
    }

    #[test]
    fn quick_sweep_decodes_each_parameter_once() {
        let q = Plan::new(Size::Quick, 64, 90);
        let d = WnwKnobs::default();
        let sweep: Vec<WnwKnobs> =
            q.wnw.iter().filter(|r| r.study == "sweep").map(|r| r.knobs).collect();
        assert_eq!(sweep.len(), 3);
        assert_eq!(sweep.iter().filter(|k| k.delta != d.delta).count(), 1);
        assert_eq!(sweep.iter().filter(|k| k.top != d.top).count(), 1);
        assert_eq!(sweep.iter().filter(|k| k.chunk != d.chunk).count(), 1);
    }

    #[test]
    fn specs_parse() {
        for r in Plan::new(Size::Full, 64, 90).swan {
            let s = r.spec("/tmp/p.safetensors", 2);
            assert!(s.parse::<models::cache::spec::CacheSpec>().is_ok(), "{s}");
        }
    }
}
