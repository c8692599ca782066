//! Bad input gets typed errors, never a panic (team standard): score arrays of the wrong
//! length and NaN scores (WnW §2.2–2.3 signals), an audio span outside the sequence (§2.3
//! layout), a target r_GPU outside (0, 1] (§3.4), and misuse of the decode API.

mod common;

use std::sync::Arc;

use common::Model;
use kv_tiered::policy::{
    AdaKvConfig, AdaKvPolicy, ArkValeConfig, ArkValePolicy, AudioKvConfig, AudioKvPolicy,
    FullPolicy, WnwConfig, WnwPolicy,
};
use kv_tiered::scores::{HeadSensitivityAccumulator, VoiceScoreAccumulator, hit_ratio};
use kv_tiered::tier::{PoolSpec, TierConfig};
use kv_tiered::{
    AudioLayout, DensePromptKv, Error, HeadRoles, HostTier, RetentionSchedule, Role, TieredStore,
    TriageConfig,
};

fn layout() -> AudioLayout {
    AudioLayout::new(30, 5..25, 4, 8).unwrap()
}

fn wnw(model: &Model) -> Box<WnwPolicy> {
    let roles = HeadRoles::from_roles(
        model.layers,
        model.kv_heads,
        &[Role::Anchor, Role::Tidal, Role::Fixed, Role::Tidal],
    )
    .unwrap();
    let sched = RetentionSchedule::uniform(&roles, 0.5).unwrap();
    Box::new(WnwPolicy::new(roles, sched, model.layout, WnwConfig::default()).unwrap())
}

#[test]
fn audio_span_outside_the_sequence() {
    for (seq, span) in [(10, 5..11), (10, 10..12), (10, 4..4), (0, 0..1)] {
        assert!(matches!(AudioLayout::new(seq, span, 2, 4), Err(Error::AudioSpan { .. })));
    }
    assert!(matches!(AudioLayout::new(10, 2..8, 0, 4), Err(Error::Param { .. })));
    assert!(matches!(AudioLayout::new(10, 2..8, 4, 3), Err(Error::Param { .. })));
    assert!(matches!(
        AudioLayout::from_rate(10, 2..8, f64::NAN, 2.0, 4.0),
        Err(Error::Param { .. })
    ));
}

#[test]
fn target_r_gpu_outside_unit_interval() {
    let roles = HeadRoles::triage(
        2,
        4,
        &[0.5; 8],
        &[1.0; 8],
        TriageConfig { n_voice: 4, n_anchor: 1, ..Default::default() },
    )
    .unwrap();
    for t in [0.0, -0.1, 1.0001, f64::NAN, f64::INFINITY] {
        assert!(
            matches!(
                RetentionSchedule::solve(&roles, &layout(), t),
                Err(Error::TargetOutOfRange { .. })
            ),
            "{t}"
        );
        assert!(matches!(
            WnwPolicy::for_target(roles.clone(), layout(), t, WnwConfig::default()),
            Err(Error::TargetOutOfRange { .. })
        ));
        assert!(matches!(
            AdaKvPolicy::new(AdaKvConfig::ada_kv(t)),
            Err(Error::TargetOutOfRange { .. })
        ));
        assert!(matches!(
            AudioKvPolicy::new(AudioKvConfig::new(t, vec![1.0; 8])),
            Err(Error::TargetOutOfRange { .. })
        ));
        assert!(matches!(
            ArkValePolicy::new(ArkValeConfig::new(t)),
            Err(Error::TargetOutOfRange { .. })
        ));
    }
    // Anchors alone exceed the target: a typed "unreachable", not a silent miss.
    let r = RetentionSchedule::solve(&roles, &layout(), 0.05);
    assert!(matches!(r, Err(Error::TargetUnreachable { .. })), "{r:?}");
}

#[test]
fn calibration_scores_wrong_length_or_nan() {
    let cfg = TriageConfig { n_voice: 2, n_anchor: 1, ..Default::default() };
    assert!(matches!(HeadRoles::triage(2, 2, &[0.1; 3], &[1.0; 4], cfg), Err(Error::Shape { .. })));
    assert!(matches!(
        HeadRoles::triage(2, 2, &[0.1, f32::NAN, 0.2, 0.3], &[1.0; 4], cfg),
        Err(Error::NonFinite { index: 1, .. })
    ));
    assert!(matches!(
        HeadRoles::triage(2, 2, &[0.1; 4], &[1.0, -1.0, 1.0, 1.0], cfg),
        Err(Error::Negative { .. })
    ));
    let bad = TriageConfig { n_voice: 5, ..cfg };
    assert!(matches!(HeadRoles::triage(2, 2, &[0.1; 4], &[1.0; 4], bad), Err(Error::Param { .. })));
    assert!(matches!(hit_ratio(&[0.1, f32::NAN], 0..1, 1), Err(Error::NonFinite { .. })));
    assert!(matches!(hit_ratio(&[0.1, 0.2], 0..1, 3), Err(Error::Param { .. })));
    assert!(matches!(hit_ratio(&[0.1, 0.2], 1..3, 1), Err(Error::AudioSpan { .. })));
    let mut vs = VoiceScoreAccumulator::new(1, 4, 2, 2).unwrap();
    assert!(matches!(vs.observe(0, 4, &[0.1; 5], 0..1), Err(Error::HeadOutOfRange { .. })));
    assert!(matches!(vs.voice_scores(), Err(Error::Param { .. })));
    let mut hs = HeadSensitivityAccumulator::new(1, 1).unwrap();
    assert!(matches!(hs.observe_gradients(0, 0, &[1.0; 5], 2), Err(Error::Shape { .. })));
    assert!(matches!(hs.observe_norms(0, 0, &[f32::INFINITY]), Err(Error::NonFinite { .. })));
}

#[test]
fn roles_json_errors() {
    assert!(matches!(HeadRoles::from_json("{not json"), Err(Error::Json(_))));
    let r = HeadRoles::triage(
        1,
        3,
        &[0.1, 0.2, 0.3],
        &[1.0; 3],
        TriageConfig { n_voice: 2, n_anchor: 1, ..Default::default() },
    )
    .unwrap();
    let json = r.to_json().unwrap().replacen("\"Fixed\"", "\"Tidal\"", 1);
    assert!(matches!(HeadRoles::from_json(&json), Err(Error::Roles(_))));
}

#[test]
fn prefill_scores_wrong_length_nan_or_negative() {
    let m = Model::random(1, 2, 2, 2, 4, layout());
    let n = m.heads() * 20;
    for (scores, want) in
        [(vec![0.5; n - 1], "shape"), (vec![0.5; n + 1], "shape"), (vec![], "shape")]
    {
        let r = TieredStore::prefill_host(m.config(2), wnw(&m), &m.kv, &scores);
        assert!(matches!(r, Err(Error::Shape { .. })), "{want}: {:?}", r.err());
    }
    let mut s = vec![0.5; n];
    s[7] = f32::NAN;
    assert!(matches!(
        TieredStore::prefill_host(m.config(2), wnw(&m), &m.kv, &s),
        Err(Error::NonFinite { index: 7, .. })
    ));
    s[7] = -0.5;
    assert!(matches!(
        TieredStore::prefill_host(m.config(2), wnw(&m), &m.kv, &s),
        Err(Error::Negative { .. })
    ));
    // K/V with a NaN, or too short.
    let mut keys = m.keys.clone();
    keys[3] = f32::NAN;
    let kv = DensePromptKv::new(2, 2, 30, 4, keys, m.values.clone()).unwrap();
    assert!(matches!(
        TieredStore::prefill_host(m.config(2), wnw(&m), &kv, &m.scores),
        Err(Error::NonFinite { .. })
    ));
    assert!(matches!(
        DensePromptKv::new(2, 2, 30, 4, vec![0.0; 5], vec![0.0; 5]),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn tier_that_does_not_match_the_config() {
    let m = Model::random(2, 2, 2, 2, 4, layout());
    let spec = PoolSpec { page_rows: 4, key_row_bytes: 12, value_row_bytes: 16 };
    let tier = Arc::new(
        HostTier::new(TierConfig {
            layers: 2,
            pools: vec![spec],
            device_pages_per_layer: None,
            host_pages: None,
        })
        .unwrap(),
    );
    assert!(matches!(
        TieredStore::prefill(m.config(2), tier, Box::new(FullPolicy), &m.kv, &[]),
        Err(Error::Param { .. })
    ));
}

#[test]
fn decode_api_misuse() {
    let m = Model::random(3, 2, 2, 2, 4, layout());
    let mut store = TieredStore::prefill_host(m.config(1), wnw(&m), &m.kv, &m.scores).unwrap();
    assert!(matches!(store.add_audio_weights(&[0.1; 19]), Err(Error::Shape { .. })));
    let mut w = vec![0.1; 20];
    w[2] = f32::NAN;
    assert!(matches!(store.add_audio_weights(&w), Err(Error::NonFinite { .. })));
    assert!(
        matches!(store.add_anchor_weights(0, 1, &[5, 6], &[0.1, 0.2]), Err(Error::Param { .. })),
        "head 1 is tidal"
    );
    assert!(matches!(store.add_anchor_weights(0, 0, &[5, 6], &[0.1]), Err(Error::Shape { .. })));
    assert!(matches!(
        store.add_anchor_weights(2, 0, &[5], &[0.1]),
        Err(Error::HeadOutOfRange { .. })
    ));
    assert!(matches!(store.append(0, &[0.0; 7], &[0.0; 8]), Err(Error::Shape { .. })));
    assert!(matches!(store.append(0, &[f32::NAN; 8], &[0.0; 8]), Err(Error::NonFinite { .. })));
    assert!(matches!(store.observe_queries(0, &[0.0; 3]), Err(Error::Shape { .. })));
    assert!(matches!(store.layer_view(2), Err(Error::HeadOutOfRange { .. })));
    store.append(0, &[0.0; 8], &[0.0; 8]).unwrap();
    assert!(matches!(
        store.append(0, &[0.0; 8], &[0.0; 8]),
        Err(Error::Capacity { capacity: 1, .. })
    ));
    // Errors left the store usable and consistent.
    store.end_step().unwrap();
    let audit = store.audit().unwrap();
    assert!(audit.violations.is_empty(), "{:?}", audit.violations);
}

/// A policy that returns fixed prefill plans (to feed the store malformed ones).
struct Scripted(Vec<kv_tiered::policy::HeadPlan>);

impl kv_tiered::Policy for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn prefill_signal(&self) -> kv_tiered::policy::PrefillSignal {
        kv_tiered::policy::PrefillSignal::None
    }
    fn step_signal(&self) -> kv_tiered::policy::StepSignal {
        kv_tiered::policy::StepSignal::None
    }
    fn unit_len(&self, layout: &AudioLayout) -> usize {
        layout.segment_len()
    }
    fn is_anchor(&self, _head: usize) -> bool {
        false
    }
    fn plan_prefill(
        &mut self,
        _ctx: &kv_tiered::policy::PrefillContext<'_>,
    ) -> kv_tiered::Result<Vec<kv_tiered::policy::HeadPlan>> {
        Ok(self.0.clone())
    }
    fn plan_step(
        &mut self,
        _obs: &kv_tiered::policy::StepObservation<'_>,
        _r: &kv_tiered::policy::Residency,
        _plan: &mut kv_tiered::policy::StepPlan,
    ) {
    }
}

/// Pooled (token-merged) runs that overlap, leave the audio, are empty, do not match the
/// device rows or swallow a host row are refused with a typed error naming `pooled`.
#[test]
fn malformed_pooled_runs_are_typed_errors() {
    use kv_tiered::policy::HeadPlan;
    let m = Model::random(21, 1, 2, 1, 4, layout());
    let ok = HeadPlan { device: vec![0, 4], pooled: vec![4, 2], ..HeadPlan::default() };
    let bad = [
        HeadPlan { device: vec![0, 2], pooled: vec![3, 1], ..HeadPlan::default() }, // overlap
        HeadPlan { device: vec![18], pooled: vec![3], ..HeadPlan::default() },      // past the end
        HeadPlan { device: vec![0], pooled: vec![0], ..HeadPlan::default() },       // empty run
        HeadPlan { device: vec![0, 4], pooled: vec![2], ..HeadPlan::default() },    // count
        HeadPlan { device: vec![0], pooled: vec![3], host: vec![1], ..HeadPlan::default() },
    ];
    let store = |plans: Vec<HeadPlan>| {
        TieredStore::prefill_host(m.config(2), Box::new(Scripted(plans)), &m.kv, &[])
    };
    let s = store(vec![ok.clone(), ok.clone()]).unwrap();
    assert!((s.run_metrics().prefill_r_gpu - 2.0 / 20.0).abs() < 1e-12);
    for b in bad {
        match store(vec![ok.clone(), b.clone()]) {
            Err(Error::Param { name: "pooled", .. }) => {}
            Err(e) if b.host.is_empty() => panic!("{b:?}: {e}"),
            Err(Error::Param { .. }) => {}
            other => panic!("{b:?}: {:?}", other.map(|_| ())),
        }
    }
}
