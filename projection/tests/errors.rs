//! Bad input gets a typed error, never a panic, and leaves state untouched: NaN samples,
//! heads without samples, mismatched shapes, bad weights, non-applicable ablations.

use projection::{
    BasisKind, CalibrationConfig, Calibrator, Error, LayerActivations, Mat, ModelDims,
    ProjectionSet, Stream, Weighting, absorb_output_weights, absorb_value_weights,
};

fn dims() -> ModelDims {
    ModelDims::new(2, 4, 2, 4).unwrap()
}

#[test]
fn nan_samples_are_rejected_before_anything_is_added() {
    let mut cal = Calibrator::new(dims(), CalibrationConfig::default()).unwrap();
    let (q, kv) = (vec![1.0f32; 3 * 4 * 4], vec![1.0f32; 3 * 2 * 4]);
    let mut bad_o = q.clone();
    bad_o[17] = f32::NAN;
    let acts =
        LayerActivations { n_tokens: 3, queries: &q, keys: &kv, values: &kv, attn_out: &bad_o };
    let err = cal.observe_layer(0, &acts).unwrap_err();
    assert!(matches!(err, Error::NonFinite { what: "attn_out", index: 17, .. }), "{err}");
    // QK was valid but must not have been added either (all-or-nothing per layer call).
    assert_eq!(cal.counts(Stream::Qk, 0, 0).unwrap().tokens, 0);
    let mut bad_k = kv.clone();
    bad_k[0] = f32::INFINITY;
    assert!(matches!(cal.observe_qk(0, 3, &q, &bad_k), Err(Error::NonFinite { what: "keys", .. })));
    assert_eq!(cal.moment(Stream::Qk, 0, 1).unwrap().trace(), 0.0);
}

#[test]
fn a_head_without_samples_is_named() {
    let mut cal = Calibrator::new(dims(), CalibrationConfig::default()).unwrap();
    let (q, kv) = (vec![1.0f32; 4 * 4], vec![0.5f32; 2 * 4]);
    cal.observe_layer(
        0,
        &LayerActivations { n_tokens: 1, queries: &q, keys: &kv, values: &kv, attn_out: &q },
    )
    .unwrap();
    cal.observe_qk(1, 1, &q, &kv).unwrap(); // layer 1 VO never observed
    let err = cal.finish("m").unwrap_err();
    match err {
        Error::NoSamples { site, .. } => {
            assert_eq!((site.layer, site.kv_head, site.stream), (1, 0, Stream::Vo));
        }
        other => panic!("expected NoSamples, got {other}"),
    }
    // All-zero samples: data present but no direction to learn.
    let mut zeros =
        Calibrator::new(ModelDims::new(1, 1, 1, 3).unwrap(), CalibrationConfig::default()).unwrap();
    zeros.observe_qk(0, 2, &[0.0; 6], &[0.0; 6]).unwrap();
    zeros.observe_vo(0, 2, &[0.0; 6], &[0.0; 6]).unwrap();
    assert!(matches!(zeros.finish("m"), Err(Error::ZeroEnergy { .. })));
    // An empty chunk (n_tokens = 0) is accepted but adds no samples.
    let mut empty =
        Calibrator::new(ModelDims::new(1, 1, 1, 3).unwrap(), CalibrationConfig::default()).unwrap();
    empty.observe_qk(0, 0, &[], &[]).unwrap();
    assert!(matches!(empty.finish("m"), Err(Error::NoSamples { .. })));
}

#[test]
fn mismatched_shapes_and_indices() {
    let mut cal = Calibrator::new(dims(), CalibrationConfig::default()).unwrap();
    let q = vec![0.0f32; 2 * 4 * 4];
    let kv = vec![0.0f32; 2 * 2 * 4];
    assert!(matches!(
        cal.observe_qk(0, 2, &q[1..], &kv),
        Err(Error::Shape { what: "queries", expected: 32, got: 31, .. })
    ));
    assert!(matches!(cal.observe_vo(0, 3, &kv, &q), Err(Error::Shape { .. })));
    assert!(matches!(
        cal.observe_qk(2, 2, &q, &kv),
        Err(Error::OutOfRange { what: "layer", index: 2, .. })
    ));
    assert!(matches!(cal.moment(Stream::Qk, 0, 2), Err(Error::OutOfRange { what: "kv-head", .. })));
    assert!(matches!(ModelDims::new(2, 6, 4, 8), Err(Error::InvalidDims { .. })));
    assert!(matches!(ModelDims::new(0, 4, 2, 8), Err(Error::InvalidDims { .. })));

    let set = ProjectionSet::random(dims(), "m", 1).unwrap();
    let mut out = vec![0.0; q.len()];
    assert!(matches!(set.rotate_queries_into(0, 2, &q, &mut out[1..]), Err(Error::Shape { .. })));
    assert!(matches!(set.rotate_keys_into(0, 2, &q, &mut out), Err(Error::Shape { .. })));
    assert!(matches!(set.rotate_keys(5, 2, &mut out), Err(Error::OutOfRange { .. })));

    let hidden = 8;
    let mut w_v = vec![0.5f32; 2 * 4 * hidden];
    let before = w_v.clone();
    let mut short_bias = vec![0.0f32; 7];
    assert!(matches!(
        set.absorb_value(0, &mut w_v, hidden, Some(&mut short_bias)),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(set.absorb_value(0, &mut w_v, hidden + 1, None), Err(Error::Shape { .. })));
    assert_eq!(w_v, before, "failed absorption must not modify the weights");
    let mut w_o = vec![0.5f32; hidden * 4 * 4];
    w_o[3] = f32::NAN;
    assert!(matches!(
        set.absorb_output(0, &mut w_o, hidden),
        Err(Error::NonFinite { what: "w_o", .. })
    ));
    assert!(matches!(set.absorb_output(3, &mut w_o, hidden), Err(Error::OutOfRange { .. })));

    let (p4, p3) = (Mat::identity(4), Mat::identity(3));
    assert!(matches!(
        absorb_value_weights(&[&p4, &p3], &mut w_v, hidden, None),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(absorb_value_weights(&[], &mut w_v, hidden, None), Err(Error::Shape { .. })));
    let mut w_o = vec![0.5f32; hidden * 3 * 4];
    assert!(matches!(
        absorb_output_weights(&[&p4, &p4], 3, &mut w_o, hidden),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn bad_weights_and_inapplicable_ablations() {
    for w in [
        Weighting::Custom { query_side: -1.0, kv_side: 1.0 },
        Weighting::Custom { query_side: 1.0, kv_side: f64::NAN },
        Weighting::Custom { query_side: 0.0, kv_side: 0.0 },
    ] {
        let cfg = CalibrationConfig { vo: w, ..Default::default() };
        assert!(matches!(Calibrator::new(dims(), cfg), Err(Error::InvalidWeight { .. })), "{w:?}");
    }
    let one_layer_one_head =
        ProjectionSet::identity(ModelDims::new(1, 4, 1, 4).unwrap(), "m").unwrap();
    assert!(matches!(
        one_layer_one_head.layer_shuffle(1),
        Err(Error::AblationNotApplicable { .. })
    ));
    assert!(matches!(one_layer_one_head.head_shuffle(1), Err(Error::AblationNotApplicable { .. })));
    assert!(matches!(
        one_layer_one_head.ablation(BasisKind::Calibrated),
        Err(Error::AblationNotApplicable { .. })
    ));
    assert!("random:x".parse::<BasisKind>().is_err());
    assert!("nope".parse::<BasisKind>().is_err());
    assert_eq!("random".parse::<BasisKind>().unwrap(), BasisKind::Random { seed: 0 });
    assert_eq!(
        "hadamard-signs".parse::<BasisKind>().unwrap(),
        BasisKind::SignedHadamard { seed: 0 }
    );
    assert!("hadamard-signs:-1".parse::<BasisKind>().is_err());
    assert!(BasisKind::from_name("hadamard-signs", None).is_err());
    assert_eq!(
        "hadamard-value-signs".parse::<BasisKind>().unwrap(),
        BasisKind::SignedHadamardValues { seed: 0 }
    );
    assert!(BasisKind::from_name("hadamard-value-signs", None).is_err());
    let odd = ModelDims::new(1, 2, 1, 12).unwrap();
    assert!(matches!(
        ProjectionSet::identity(odd, "m").unwrap().ablation(BasisKind::SignedHadamard { seed: 1 }),
        Err(Error::InvalidDims { .. })
    ));
    assert!(matches!(
        ProjectionSet::identity(odd, "m")
            .unwrap()
            .ablation(BasisKind::SignedHadamardValues { seed: 1 }),
        Err(Error::InvalidDims { .. })
    ));
}

#[test]
fn non_orthogonal_or_ill_shaped_user_bases_are_rejected() {
    use projection::{Basis, Provenance};
    let d = ModelDims::new(1, 1, 1, 2).unwrap();
    let prov = Provenance {
        model: "m".into(),
        calibration_tokens: 0,
        kind: BasisKind::Identity,
        config: None,
    };
    let skew = Basis::new(Mat::from_vec(2, 2, vec![1.0, 0.1, 0.0, 1.0]).unwrap()).unwrap();
    let eye = Basis::new(Mat::identity(2)).unwrap();
    let err = ProjectionSet::from_parts(d, vec![eye.clone()], vec![skew], None, prov.clone())
        .unwrap_err();
    assert!(matches!(err, Error::NotOrthogonal { site, .. } if site.stream == Stream::Vo), "{err}");
    let big = Basis::new(Mat::identity(3)).unwrap();
    assert!(matches!(
        ProjectionSet::from_parts(d, vec![big], vec![eye.clone()], None, prov.clone()),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(
        ProjectionSet::from_parts(d, vec![], vec![eye], None, prov),
        Err(Error::Shape { .. })
    ));
    assert!(matches!(Basis::new(Mat::zeros(2, 3)), Err(Error::Shape { .. })));
}
