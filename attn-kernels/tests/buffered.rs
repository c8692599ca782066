//! Buffered quantized kv-heads ([`QuantKv::with_buffer`]): `f32` sink rows, quantized rows
//! (some in a prefix) and a recent-token buffer of dense `f32` / `f16` / `bf16` rows (a ring
//! split into two halves) attend as the f64 reference does under one softmax, on every
//! instruction set and GQA layout; with nothing but buffer rows stored they attend bit for
//! bit as the dense kernel over the same rows (the lossless setting of a buffered cache whose
//! buffer holds every token); kv-sparse's [`QuantHybridCache`] lends its rows so; malformed
//! buffers are typed errors.

mod common;

use attn_kernels::accuracy::Kernel;
use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, DecodedKv, DenseKv, EncodedAttention, Error,
    QuantKv, RecentFormat, Reference, synth,
};
use common::{LAYOUTS, assert_close, cfg, engines};
use half::{bf16, f16};
use kv_sparse::ValueFormat;
use kv_sparse::decoded::Side;
use kv_sparse::hybrid::{Hybrid, HybridConfig, QuantHybridCache};
use kv_sparse::kivi::KiviRows;
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::turbo::{TurboQjlRows, TurboRows};

fn bound(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// `rows` rows of `d` as `D`, split into a ring's (older, newer) halves at `split` rows.
fn ring<D: RecentFormat>(x: &[f32], d: usize, split: usize) -> (Vec<D>, Vec<D>) {
    let all: Vec<D> = x.iter().map(|&v| D::from_f32(v)).collect();
    let (a, b) = all.split_at((split * d).min(all.len()));
    (a.to_vec(), b.to_vec())
}

/// `sink` f32 rows, `rows` quantized rows (a third in a prefix), `recent` buffer rows in `D`
/// (split as a wrapped ring): every engine against the reference.
fn buffered_case<C: DenseCodec, D: RecentFormat>(
    layout: (usize, usize),
    d: usize,
    (sink, rows, recent): (usize, usize, usize),
) {
    let cfg = cfg(layout, d);
    let q = synth::values(cfg.q_len(), 17);
    let kv_heads = layout.1 as u64;
    let part = |n: usize, seed: u64| synth::values(n * d, seed);
    let heads: Vec<[Vec<f32>; 6]> = (0..kv_heads)
        .map(|h| {
            let s = 100 + 6 * h;
            [
                part(sink, s),
                part(sink, s + 1),
                part(rows, s + 2),
                part(rows, s + 3),
                part(recent, s + 4),
                part(recent, s + 5),
            ]
        })
        .collect();
    let store = |x: &[f32]| {
        let mut s = QuantRows::<C>::new(d).unwrap();
        s.push(x).unwrap();
        s
    };
    let cut = rows / 3 * d;
    let wrap = recent / 2;
    type Stores<C, D> =
        ((QuantRows<C>, QuantRows<C>), (QuantRows<C>, QuantRows<C>), [(Vec<D>, Vec<D>); 2]);
    let stores: Vec<Stores<C, D>> = heads
        .iter()
        .map(|[_, _, k, v, bk, bv]| {
            (
                (store(&k[..cut]), store(&v[..cut])),
                (store(&k[cut..]), store(&v[cut..])),
                [ring::<D>(bk, d, wrap), ring::<D>(bv, d, wrap)],
            )
        })
        .collect();
    let kv: Vec<QuantKv<'_, C>> = heads
        .iter()
        .zip(&stores)
        .map(|([sk, sv, ..], ((k0, v0), (k1, v1), [bk, bv]))| {
            QuantKv::continuing((k0.view(), v0.view()), k1.view(), v1.view())
                .with_sink(sk, sv)
                .with_buffer((&bk.0, &bk.1), (&bv.0, &bv.1))
        })
        .collect();
    assert!(kv.iter().all(|h| h.num_rows() == sink + rows + recent && h.buffer_rows() == recent));
    let mut want = vec![0.0; cfg.q_len()];
    Reference.quantized(&cfg, &q, &kv, &mut want).unwrap();
    let max =
        heads.iter().fold(0.0f32, |m, h| m.max(bound(&h[1])).max(bound(&h[3])).max(bound(&h[5])));
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.quantized(&cfg, &q, &kv, &mut got).unwrap();
        let what = format!(
            "{name} {} + {} {layout:?} d={d} sink={sink} rows={rows} recent={recent}",
            C::FORMAT,
            D::FORMAT
        );
        assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &want, max, &what);
    }
}

#[test]
fn buffered_quantized_heads_attend_as_the_reference_for_every_layout() {
    for layout in LAYOUTS {
        for shape in [(0, 150, 7), (1, 40, 128), (2, 0, 33), (0, 70, 1)] {
            buffered_case::<Int8Blocks, f16>(layout, 64, shape);
            buffered_case::<Int4Blocks, bf16>(layout, 32, shape);
            buffered_case::<Fp8Rows, f32>(layout, 40, shape);
        }
    }
}

/// Nothing but `f32` buffer rows: bit for bit the dense kernel over the same rows, on every
/// engine — what a buffered cache whose buffer holds every token computes.
#[test]
fn a_buffer_holding_every_token_attends_bit_for_bit_as_dense() {
    for layout in LAYOUTS {
        let d = 64;
        let cfg: AttnConfig = cfg(layout, d);
        let q = synth::values(cfg.q_len(), 5);
        let rows = 300;
        let heads: Vec<(Vec<f32>, Vec<f32>)> = (0..layout.1 as u64)
            .map(|h| (synth::values(rows * d, 2 * h + 1), synth::values(rows * d, 2 * h + 2)))
            .collect();
        let empty = QuantRows::<Int4Blocks>::new(d).unwrap();
        let buffered: Vec<QuantKv<'_, Int4Blocks>> = heads
            .iter()
            .map(|(k, v)| {
                QuantKv::new(empty.view(), empty.view()).with_buffer((&k[..], &[]), (&v[..], &[]))
            })
            .collect();
        let dense: Vec<DenseKv<'_, f32>> =
            heads.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
        for (name, mut e) in engines() {
            let (mut a, mut b) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
            e.quantized(&cfg, &q, &buffered, &mut a).unwrap();
            e.dense(&cfg, &q, &dense, &mut b).unwrap();
            let (a, b): (Vec<u32>, Vec<u32>) =
                (a.iter().map(|x| x.to_bits()).collect(), b.iter().map(|x| x.to_bits()).collect());
            assert_eq!(a, b, "{name} {layout:?}");
        }
    }
}

/// kv-sparse's buffered quantized cache lends its history and buffer to the kernel: with
/// every token still in the (f32) buffer it attends as the dense cache; past the buffer its
/// oldest rows are the quantized ones, and the reference agrees.
#[test]
fn quant_hybrid_cache_rows_attend_through_the_buffered_kernel() {
    let (d, b) = (32, 16);
    let cfg = cfg((4, 2), d);
    let q = synth::values(cfg.q_len(), 9);
    let hc = HybridConfig::lossless(d, b).for_store::<QuantRows<Int8Blocks>>();
    for tokens in [b, b + 21] {
        let mut caches: Vec<QuantHybridCache<Int8Blocks, f32>> =
            (0..2).map(|_| QuantHybridCache::new(hc).unwrap()).collect();
        let mut raw = vec![(Vec::new(), Vec::new()); 2];
        for (h, c) in caches.iter_mut().enumerate() {
            let (k, v) = (
                synth::values(tokens * d, 40 + h as u64),
                synth::values(tokens * d, 50 + h as u64),
            );
            c.extend(&k, &v).unwrap();
            raw[h] = (k, v);
        }
        let kv: Vec<QuantKv<'_, Int8Blocks>> = caches
            .iter()
            .map(|c| {
                let (hk, hv) = c.history();
                QuantKv::new(hk, hv).with_buffer(c.buffer_keys(), c.buffer_values())
            })
            .collect();
        assert!(kv.iter().all(|h| h.quantized_rows() == tokens - b && h.buffer_rows() == b));
        let mut e = CpuAttention::new(1).unwrap();
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.quantized(&cfg, &q, &kv, &mut got).unwrap();
        let mut want = vec![f32::NAN; cfg.q_len()];
        if tokens == b {
            let dense: Vec<_> = raw.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
            e.dense(&cfg, &q, &dense, &mut want).unwrap();
            assert_eq!(got, want, "every token in the buffer: the dense attention");
        } else {
            Reference.quantized(&cfg, &q, &kv, &mut want).unwrap();
            let max = raw.iter().fold(0.0f32, |m, (_, v)| m.max(bound(v)));
            assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &want, max, "past the buffer");
        }
    }
}

#[test]
fn malformed_buffers_are_typed_errors() {
    let (d, cfg) = (32, cfg((2, 1), 32));
    let mut k = QuantRows::<Int8Blocks>::new(d).unwrap();
    k.push(&synth::values(4 * d, 1)).unwrap();
    let (three, two, ragged) = (vec![0.5f32; 3 * d], vec![0.5f32; 2 * d], vec![0.5f32; d + 1]);
    let q = synth::values(cfg.q_len(), 3);
    let mut out = vec![0.0; cfg.q_len()];
    let uneven = [QuantKv::new(k.view(), k.view()).with_buffer((&three[..], &[]), (&two[..], &[]))];
    let ragged =
        [QuantKv::new(k.view(), k.view()).with_buffer((&ragged[..], &[]), (&ragged[..], &[]))];
    let check = |name: &str, uneven: Error, ragged: Error| {
        assert!(
            matches!(uneven, Error::RowCountMismatch { part: "buffer", .. }),
            "{name}: {uneven}"
        );
        assert!(
            matches!(ragged, Error::RaggedRows { what: "buffer keys.0", .. }),
            "{name}: {ragged}"
        );
    };
    for (name, mut e) in engines() {
        let a = e.quantized(&cfg, &q, &uneven, &mut out).unwrap_err();
        let b = e.quantized(&cfg, &q, &ragged, &mut out).unwrap_err();
        check(&name, a, b);
    }
    let a = Reference.quantized(&cfg, &q, &uneven, &mut out).unwrap_err();
    let b = Reference.quantized(&cfg, &q, &ragged, &mut out).unwrap_err();
    check("reference", a, b);
}

/// One layout: KIVI-2, KIVI-4 (groups of 8 tokens / channels) and turbo-2/3/4 heads with a
/// sink and a buffer, every engine against the reference.
fn decoded_case(layout: (usize, usize), d: usize, (sink, rows, recent): (usize, usize, usize)) {
    let cfg = cfg(layout, d);
    let q = synth::values(cfg.q_len(), 23);
    let part = |n: usize, seed: u64| synth::values(n * d, seed);
    let heads: Vec<[Vec<f32>; 6]> = (0..layout.1 as u64)
        .map(|h| {
            let s = 300 + 6 * h;
            [
                part(sink, s),
                part(sink, s + 1),
                part(rows, s + 2),
                part(rows, s + 3),
                part(recent, s + 4),
                part(recent, s + 5),
            ]
        })
        .collect();
    let max =
        heads.iter().fold(0.0f32, |m, h| m.max(bound(&h[1])).max(bound(&h[3])).max(bound(&h[5])));
    fn check<K: kv_sparse::decoded::DecodeRows, V: kv_sparse::decoded::DecodeRows>(
        cfg: &AttnConfig,
        q: &[f32],
        kv: &[DecodedKv<'_, K, V>],
        max: f32,
        what: &str,
    ) {
        let mut want = vec![0.0; cfg.q_len()];
        Reference.decoded(cfg, q, kv, &mut want).unwrap();
        for (name, mut e) in engines() {
            let mut got = vec![f32::NAN; cfg.q_len()];
            e.decoded(cfg, q, kv, &mut got).unwrap();
            assert_close(
                Kernel::Hybrid,
                ValueFormat::F32,
                &got,
                &want,
                max,
                &format!("{name} {what}"),
            );
        }
    }
    let kivi = |bits: usize| -> Vec<(KiviRowsDyn, KiviRowsDyn)> {
        heads
            .iter()
            .map(|h| {
                let mut k = KiviRowsDyn::new(bits, Side::Keys, d);
                let mut v = KiviRowsDyn::new(bits, Side::Values, d);
                k.push(&h[2]);
                v.push(&h[3]);
                (k, v)
            })
            .collect()
    };
    let recent: Vec<(Vec<f16>, Vec<f16>)> = heads
        .iter()
        .map(|h| {
            (
                h[4].iter().map(|&x| f16::from_f32(x)).collect(),
                h[5].iter().map(|&x| f16::from_f32(x)).collect(),
            )
        })
        .collect();
    for bits in [2, 4] {
        let stores = kivi(bits);
        let kv: Vec<_> = stores
            .iter()
            .zip(&heads)
            .zip(&recent)
            .map(|(((k, v), h), (bk, bv))| {
                DecodedKv::new(k.view(), v.view())
                    .with_sink(&h[0], &h[1])
                    .with_buffer((&bk[..], &[]), (&bv[..], &[]))
            })
            .collect();
        assert!(
            kv.iter()
                .all(|h| h.num_rows() == sink + rows + recent.len().min(1) * recent[0].0.len() / d)
        );
        check(&cfg, &q, &kv, max, &format!("kivi{bits} {layout:?} d={d}"));
    }
    macro_rules! turbo {
        ($b:literal) => {{
            let stores: Vec<(TurboRows<$b>, TurboRows<$b>)> = heads
                .iter()
                .map(|h| {
                    let (mut k, mut v) =
                        (TurboRows::<$b>::new(d).unwrap(), TurboRows::<$b>::new(d).unwrap());
                    k.push(&h[2]).unwrap();
                    v.push(&h[3]).unwrap();
                    (k, v)
                })
                .collect();
            let kv: Vec<_> = stores
                .iter()
                .zip(&heads)
                .zip(&recent)
                .map(|(((k, v), h), (bk, bv))| {
                    DecodedKv::new(k.view(), v.view())
                        .with_sink(&h[0], &h[1])
                        .with_buffer((&bk[..], &[]), (&bv[..], &[]))
                })
                .collect();
            check(&cfg, &q, &kv, max, &format!("turbo{} {layout:?} d={d}", $b));
            // The QJL-keyed form: sketched keys read in place, MSE values.
            let stores: Vec<(TurboQjlRows<$b>, TurboQjlRows<$b>)> = heads
                .iter()
                .map(|h| {
                    let mut k = TurboQjlRows::<$b>::new(Side::Keys, d).unwrap();
                    let mut v = TurboQjlRows::<$b>::new(Side::Values, d).unwrap();
                    k.push(&h[2]).unwrap();
                    v.push(&h[3]).unwrap();
                    (k, v)
                })
                .collect();
            let kv: Vec<_> = stores
                .iter()
                .zip(&heads)
                .zip(&recent)
                .map(|(((k, v), h), (bk, bv))| {
                    DecodedKv::new(k.view(), v.view())
                        .with_sink(&h[0], &h[1])
                        .with_buffer((&bk[..], &[]), (&bv[..], &[]))
                })
                .collect();
            check(&cfg, &q, &kv, max, &format!("turbo{} qjl {layout:?} d={d}", $b));
        }};
    }
    turbo!(2);
    turbo!(3);
    turbo!(4);
}

/// KIVI rows of either width behind one type (the test's own convenience).
enum KiviRowsDyn {
    Two(KiviRows<2>),
    Four(KiviRows<4>),
}

impl KiviRowsDyn {
    fn new(bits: usize, side: Side, d: usize) -> Self {
        match bits {
            2 => Self::Two(KiviRows::new(side, d, 8).unwrap()),
            _ => Self::Four(KiviRows::new(side, d, 8).unwrap()),
        }
    }

    fn push(&mut self, x: &[f32]) {
        match self {
            Self::Two(r) => r.push(x).unwrap(),
            Self::Four(r) => r.push(x).unwrap(),
        }
    }

    fn view(&self) -> kv_sparse::kivi::KiviView<'_> {
        match self {
            Self::Two(r) => r.view(),
            Self::Four(r) => r.view(),
        }
    }
}

#[test]
fn decoded_histories_attend_as_the_reference_for_every_layout() {
    for layout in LAYOUTS {
        // Rows that leave KIVI keys waiting (150 = 18 groups of 8 + 6) and whole groups.
        for shape in [(0, 150, 7), (2, 64, 16), (1, 0, 5)] {
            decoded_case(layout, 64, shape);
        }
        // Heads of one, two and four KIVI value groups of 8 channels (the AVX2 kernel sizes
        // its per-group weights by the group count).
        for d in [8, 16, 32] {
            decoded_case(layout, d, (1, 150, 7));
        }
    }
}

/// kv-sparse's hybrid cache over KIVI or turbo rows, through the decoded kernel: with every
/// token in its f32 buffer it attends as the dense kernel bit for bit; past it as the
/// reference does, and no longer as the dense kernel.
#[test]
fn hybrid_caches_over_coded_rows_attend_through_the_decoded_kernel() {
    let (d, b) = (64, 16);
    let cfg = cfg((4, 2), d);
    let q = synth::values(cfg.q_len(), 31);
    for tokens in [b, b + 45] {
        let raw: Vec<(Vec<f32>, Vec<f32>)> = (0..2u64)
            .map(|h| (synth::values(tokens * d, 60 + h), synth::values(tokens * d, 70 + h)))
            .collect();
        let kc = HybridConfig::lossless(d, b).for_store::<KiviRows<2>>();
        let tc = HybridConfig::lossless(d, b).for_store::<TurboRows<3>>();
        let mut kivi: Vec<Hybrid<KiviRows<2>, f32>> =
            (0..2).map(|_| Hybrid::new(kc).unwrap()).collect();
        let mut turbo: Vec<Hybrid<TurboRows<3>, f32>> =
            (0..2).map(|_| Hybrid::new(tc).unwrap()).collect();
        for (h, (k, v)) in raw.iter().enumerate() {
            kivi[h].extend(k, v).unwrap();
            turbo[h].extend(k, v).unwrap();
        }
        let kivi_kv: Vec<_> = kivi
            .iter()
            .map(|c| {
                let (k, v) = c.history();
                DecodedKv::new(k, v).with_buffer(c.buffer_keys(), c.buffer_values())
            })
            .collect();
        let turbo_kv: Vec<_> = turbo
            .iter()
            .map(|c| {
                let (k, v) = c.history();
                DecodedKv::new(k, v).with_buffer(c.buffer_keys(), c.buffer_values())
            })
            .collect();
        let mut e = CpuAttention::new(1).unwrap();
        let dense: Vec<_> = raw.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
        let mut want = vec![f32::NAN; cfg.q_len()];
        e.dense(&cfg, &q, &dense, &mut want).unwrap();
        let max = raw.iter().fold(0.0f32, |m, (_, v)| m.max(bound(v)));
        for (name, kv) in [("kivi", 0), ("turbo", 1)] {
            let mut got = vec![f32::NAN; cfg.q_len()];
            let mut reference = vec![f32::NAN; cfg.q_len()];
            if kv == 0 {
                e.decoded(&cfg, &q, &kivi_kv, &mut got).unwrap();
                Reference.decoded(&cfg, &q, &kivi_kv, &mut reference).unwrap();
            } else {
                e.decoded(&cfg, &q, &turbo_kv, &mut got).unwrap();
                Reference.decoded(&cfg, &q, &turbo_kv, &mut reference).unwrap();
            }
            if tokens == b {
                assert_eq!(got, want, "{name}: every token in the buffer is the dense attention");
            } else {
                assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &reference, max, name);
                assert!(got != want, "{name}: past the buffer the codes change the output");
            }
        }
    }
}

#[test]
fn malformed_decoded_heads_are_typed_errors() {
    let d = 32;
    let cfg = cfg((2, 1), d);
    let mut k = TurboRows::<4>::new(d).unwrap();
    k.push(&synth::values(3 * d, 1)).unwrap();
    let mut v = TurboRows::<4>::new(d).unwrap();
    v.push(&synth::values(2 * d, 2)).unwrap();
    let q = synth::values(cfg.q_len(), 3);
    let mut out = vec![0.0; cfg.q_len()];
    let bad = [DecodedKv::new(k.view(), v.view())];
    for (name, mut e) in engines() {
        let err = e.decoded(&cfg, &q, &bad, &mut out).unwrap_err();
        assert!(matches!(err, Error::RowCountMismatch { part: "coded", .. }), "{name}: {err}");
    }
    let err = Reference.decoded(&cfg, &q, &bad, &mut out).unwrap_err();
    assert!(matches!(err, Error::RowCountMismatch { part: "coded", .. }), "{err}");
    // A decoder whose in-place layout disagrees with its rows.
    use kv_sparse::decoded::DecodeRows;
    struct Lying<'a>(kv_sparse::turbo::TurboView<'a>);
    impl DecodeRows for Lying<'_> {
        fn head_dim(&self) -> usize {
            self.0.head_dim()
        }
        fn num_rows(&self) -> usize {
            self.0.num_rows()
        }
        fn decode_row(&self, j: usize, out: &mut [f32]) {
            self.0.decode_row(j, out);
        }
        fn codes(&self) -> Option<kv_sparse::decoded::RowCodes<'_>> {
            Some(kv_sparse::decoded::RowCodes::Codebook { bits: 4, levels: &[0.0; 16], bytes: &[] })
        }
    }
    let bad = [DecodedKv::new(Lying(k.view()), Lying(k.view()))];
    for (name, mut e) in engines() {
        let err = e.decoded(&cfg, &q, &bad, &mut out).unwrap_err();
        assert!(
            matches!(err, Error::Sparse(kv_sparse::Error::InvalidCodeLayout { .. })),
            "{name}: {err}"
        );
    }
    let wide = TurboRows::<4>::new(64).unwrap();
    let bad = [DecodedKv::new(wide.view(), wide.view())];
    assert!(matches!(
        Reference.decoded(&cfg, &q, &bad, &mut out),
        Err(Error::HeadDimMismatch { .. })
    ));
}
