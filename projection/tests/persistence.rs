//! Safetensors round trips and load-time validation of projection files (SWAN §4: bases
//! are computed offline once and loaded with the model) — including files from another
//! model, corrupt, truncated, non-orthogonal and NaN-carrying files.

mod common;

use std::collections::HashMap;

use common::{LayerWeights, calibrate_on, gaussian};
use projection::{BasisKind, Error, ModelDims, ProjectionSet, Stream};
use safetensors::tensor::{SafeTensors, TensorView};

fn smol_dims() -> ModelDims {
    ModelDims::new(30, 9, 3, 64).unwrap()
}

fn calibrated() -> ProjectionSet {
    let dims = ModelDims::new(2, 4, 2, 8).unwrap();
    let ws: Vec<LayerWeights> = (0..2).map(|l| LayerWeights::random(dims, 12, true, l)).collect();
    calibrate_on(&ws, &gaussian(10 * 12, 1.0, 3), 10, "tiny-llama")
}

#[test]
fn every_kind_round_trips_through_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let cal = calibrated();
    let kinds = [
        BasisKind::Calibrated,
        BasisKind::Random { seed: 42 },
        BasisKind::Identity,
        BasisKind::Hadamard,
        BasisKind::HadamardValues,
        BasisKind::SignedHadamard { seed: 5 },
        BasisKind::SignedHadamardValues { seed: 7 },
        BasisKind::HadamardJitter { seed: 6 },
        BasisKind::LayerShuffle { seed: 1 },
        BasisKind::HeadShuffle { seed: 2 },
        BasisKind::KvShuffle,
    ];
    for kind in kinds {
        let set =
            if kind == BasisKind::Calibrated { cal.clone() } else { cal.ablation(kind).unwrap() };
        let path = dir.path().join(format!("{}.safetensors", kind.name()));
        set.save(&path).unwrap();
        let back = ProjectionSet::load_for(&path, &set.dims(), Some("tiny-llama")).unwrap();
        assert_eq!(back, set, "{kind}");
        assert_eq!(back.kind(), kind);
        assert_eq!(back.kind().to_string().parse::<BasisKind>().unwrap(), kind);
    }
    let back = ProjectionSet::load(dir.path().join("calibrated.safetensors")).unwrap();
    assert!(back.energy_curve(Stream::Vo, 1, 1).unwrap().is_some());
    assert_eq!(back.provenance().calibration_tokens, 10);
    assert!(back.counts(0, 1).unwrap().is_some());
    assert!(!dir.path().join("calibrated.safetensors.tmp").exists());
}

#[test]
fn metadata_is_self_describing() {
    let bytes =
        ProjectionSet::random(smol_dims(), "SmolLM2-135M-Instruct", 7).unwrap().to_bytes().unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap();
    assert_eq!(meta["format"], "kvtide-projection");
    assert_eq!(meta["model"], "SmolLM2-135M-Instruct");
    assert_eq!(meta["kind"], "random");
    assert_eq!(meta["seed"], "7");
    assert_eq!(
        (meta["layers"].as_str(), meta["kv_heads"].as_str(), meta["head_dim"].as_str()),
        ("30", "3", "64")
    );
    let file = SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(file.tensor("qk").unwrap().shape(), &[30, 3, 64, 64]);
}

#[test]
fn a_file_from_another_model_is_rejected_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("smol.safetensors");
    ProjectionSet::identity(smol_dims(), "SmolLM2-135M-Instruct").unwrap().save(&path).unwrap();
    let llama = ModelDims::new(32, 32, 8, 128).unwrap();
    let err = ProjectionSet::load_for(&path, &llama, None).unwrap_err();
    assert!(
        matches!(&err, Error::Mismatch { what: "layers", expected, got, .. } if expected == "32" && got == "30")
    );
    assert!(err.to_string().contains("layers mismatch: expected 32, got 30"), "{err}");
    for (dims, what) in [
        (ModelDims::new(30, 9, 3, 128).unwrap(), "head_dim"),
        (ModelDims::new(30, 9, 9, 64).unwrap(), "kv_heads"),
        (ModelDims::new(30, 6, 3, 64).unwrap(), "q_heads"),
    ] {
        let err = ProjectionSet::load_for(&path, &dims, None).unwrap_err();
        assert!(matches!(err, Error::Mismatch { what: w, .. } if w == what), "{err}");
    }
    let err = ProjectionSet::load_for(&path, &smol_dims(), Some("Qwen2-0.5B")).unwrap_err();
    assert!(matches!(err, Error::Mismatch { what: "model", .. }), "{err}");
}

/// Rewrites a serialized set with `edit` applied to its tensors and metadata.
fn rewrite(
    bytes: &[u8],
    edit: impl FnOnce(&mut HashMap<String, Vec<u8>>, &mut HashMap<String, String>),
) -> Vec<u8> {
    let (_, header) = SafeTensors::read_metadata(bytes).unwrap();
    let mut meta = header.metadata().clone().unwrap();
    let file = SafeTensors::deserialize(bytes).unwrap();
    let mut shapes = HashMap::new();
    let mut data: HashMap<String, Vec<u8>> = HashMap::new();
    for (name, t) in file.tensors() {
        shapes.insert(name.clone(), (t.dtype(), t.shape().to_vec()));
        data.insert(name, t.data().to_vec());
    }
    edit(&mut data, &mut meta);
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(n, b)| {
            let (dt, shape) = shapes[n].clone();
            (n.clone(), TensorView::new(dt, shape, b).unwrap())
        })
        .collect();
    safetensors::serialize(views, Some(meta)).unwrap()
}

#[test]
fn corrupt_files_give_typed_errors() {
    let good = calibrated().to_bytes().unwrap();
    assert!(ProjectionSet::from_bytes(&good).is_ok());
    assert!(matches!(
        ProjectionSet::from_bytes(&good[..good.len() - 9]),
        Err(Error::Safetensors(_))
    ));
    assert!(matches!(ProjectionSet::from_bytes(&good[..5]), Err(Error::Safetensors(_))));

    let scaled = rewrite(&good, |t, _| {
        let qk = t.get_mut("qk").unwrap();
        let x = f32::from_le_bytes(qk[..4].try_into().unwrap()) * 2.0;
        qk[..4].copy_from_slice(&x.to_le_bytes());
    });
    let err = ProjectionSet::from_bytes(&scaled).unwrap_err();
    assert!(
        matches!(err, Error::NotOrthogonal { site, .. } if site.layer == 0 && site.stream == Stream::Qk),
        "{err}"
    );

    let nan = rewrite(&good, |t, _| {
        t.get_mut("vo").unwrap()[4..8].copy_from_slice(&f32::NAN.to_le_bytes())
    });
    assert!(matches!(ProjectionSet::from_bytes(&nan), Err(Error::NonFinite { .. })));

    let missing = rewrite(&good, |t, _| {
        t.remove("vo");
    });
    assert!(matches!(ProjectionSet::from_bytes(&missing), Err(Error::Format { .. })));

    // Query energies: optional (files written before they existed still open), but never
    // negative or NaN.
    let without = rewrite(&good, |t, _| {
        t.remove("qk.query_energy");
    });
    let old = ProjectionSet::from_bytes(&without).unwrap();
    assert!(old.basis(Stream::Qk, 0, 0).unwrap().query_energy().is_none());
    assert!(calibrated().basis(Stream::Qk, 0, 0).unwrap().query_energy().is_some());
    for bad in [-1.0f64, f64::NAN] {
        let corrupt = rewrite(&good, |t, _| {
            t.get_mut("qk.query_energy").unwrap()[8..16].copy_from_slice(&bad.to_le_bytes())
        });
        let err = ProjectionSet::from_bytes(&corrupt).unwrap_err();
        assert!(matches!(err, Error::InvalidWeight { .. } | Error::NonFinite { .. }), "{err}");
    }

    let half_counts = rewrite(&good, |t, _| {
        t.remove("weights");
    });
    assert!(matches!(ProjectionSet::from_bytes(&half_counts), Err(Error::Format { .. })));

    for (key, value) in [
        ("format", "something-else"),
        ("format_version", "99"),
        ("kind", "sideways"),
        ("layers", "three"),
        ("head_dim", "16"),
        ("config", "{not json"),
    ] {
        let bad = rewrite(&good, |_, m| {
            m.insert(key.into(), value.into());
        });
        assert!(
            matches!(ProjectionSet::from_bytes(&bad), Err(Error::Format { .. })),
            "{key}={value}"
        );
    }
    let no_model = rewrite(&good, |_, m| {
        m.remove("model");
    });
    assert!(matches!(ProjectionSet::from_bytes(&no_model), Err(Error::Format { .. })));
}

/// Regression (found by the in-tree property fuzzing in `integration-tests`): NaN, ∞ or
/// negative sample weights in the `weights` tensor used to be accepted (and broke
/// `PartialEq` round trips); they are corrupt files.
#[test]
fn non_finite_or_negative_sample_weights_are_rejected() {
    let good = calibrated().to_bytes().unwrap();
    for bad_weight in [f64::NAN, f64::INFINITY, -1.0] {
        let bad = rewrite(&good, |t, _| {
            t.get_mut("weights").unwrap()[8..16].copy_from_slice(&bad_weight.to_le_bytes())
        });
        let err = ProjectionSet::from_bytes(&bad).unwrap_err();
        assert!(matches!(err, Error::InvalidWeight { .. }), "{bad_weight}: {err}");
    }
}

#[test]
fn io_errors_name_the_path() {
    let err = ProjectionSet::load("/nonexistent/dir/p.safetensors").unwrap_err();
    assert!(matches!(err, Error::Io { op: "read", .. }));
    assert!(err.to_string().contains("/nonexistent/dir/p.safetensors"));
    let set = ProjectionSet::identity(ModelDims::new(1, 1, 1, 2).unwrap(), "m").unwrap();
    assert!(matches!(set.save("/nonexistent/dir/p.safetensors"), Err(Error::Io { .. })));
}
