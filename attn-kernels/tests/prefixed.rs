//! A hybrid history split into a prefix held elsewhere and the rest ([`PrefixedHybrid`],
//! [`PrefixedCodedHybrid`]) attends as the contiguous history does: bit for bit on every
//! instruction set when the prefix holds whole tiles (and whole blocks, for CSR rows),
//! within rounding otherwise; dense quantized rows in two parts (`QuantKv::continuing`)
//! attend bit for bit as in one; the reference agrees; `f32` sink rows before quantized rows
//! (`QuantKv::with_sink`) attend as the reference does under one softmax, and attend as the
//! dense kernel over the same rows when nothing else is stored; sink rows before a hybrid or
//! coded hybrid head ([`WithSink`], with or without a history prefix) attend as the
//! reference does, and a lossless head with a sink as the dense kernel over all its rows;
//! malformed prefixes and sinks are typed errors.

mod common;

use attn_kernels::accuracy::Kernel;
use attn_kernels::{
    AttnConfig, CpuAttention, DecodeAttention, EncodedAttention, Error, Isa, PrefixedCodedHybrid,
    PrefixedHybrid, QuantKv, Reference, WithSink, synth,
};
use common::{assert_close, cfg};
use half::f16;
use kv_sparse::ValueFormat;
use kv_sparse::coded::{
    Bitmask, CodedStore, Elems, IndexCode, Int4Values, Int8Values, List, ValueCode,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, HybridCache, HybridConfig};
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};

const TILE: usize = CpuAttention::TILE_ROWS;

/// Every instruction set, on 1 thread with the default split and on 2 threads with items
/// of two tiles (so a prefix boundary also falls inside and between items).
fn engines() -> Vec<(String, CpuAttention)> {
    let mut out = Vec::new();
    for isa in Isa::available() {
        for (threads, split) in [(1, CpuAttention::DEFAULT_SPLIT_ROWS), (2, 2 * TILE)] {
            let e = CpuAttention::new(threads).unwrap().with_isa(isa).unwrap();
            out.push((format!("{isa}/{threads}t/split{split}"), e.with_split_rows(split).unwrap()));
        }
    }
    out
}

/// Prefix lengths for a history of `rows`: none, whole tiles, a ragged cut, all of it.
fn splits(rows: usize) -> Vec<usize> {
    let mut s = vec![0, TILE, 2 * TILE, 3 * TILE, 45, rows];
    s.retain(|&p| p <= rows);
    s
}

fn bound(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Checks a split attention against the contiguous one: equal bits when `exact`, the
/// hybrid tolerance otherwise.
fn check(got: &[f32], want: &[f32], exact: bool, max: f32, what: &str) {
    if exact {
        let (g, w): (Vec<u32>, Vec<u32>) =
            (got.iter().map(|x| x.to_bits()).collect(), want.iter().map(|x| x.to_bits()).collect());
        assert_eq!(g, w, "{what}: a prefix of whole tiles must not change a bit");
    } else {
        assert_close(Kernel::Hybrid, ValueFormat::F32, got, want, max, what);
    }
}

fn csr_case(layout: (usize, usize), d: usize, (buffer, k, tokens): (usize, usize, usize)) {
    let cfg: AttnConfig = cfg(layout, d);
    let hybrid = HybridConfig { rows_per_block: 64, ..HybridConfig::new(d, buffer, k) };
    let mut max = 0.0f32;
    let whole: Vec<HybridCache<u8, f16, f16>> = (0..layout.1 as u64)
        .map(|h| {
            let mut c = HybridCache::new(hybrid).unwrap();
            let (k, v) = (synth::values(tokens * d, 2 * h + 1), synth::values(tokens * d, 2 * h));
            max = max.max(bound(&v));
            c.extend(&k, &v).unwrap();
            c
        })
        .collect();
    let q = synth::values(cfg.q_len(), 77);
    let mut want_ref = vec![0.0; cfg.q_len()];
    Reference.hybrid(&cfg, &q, &whole, &mut want_ref).unwrap();
    for p in splits(whole[0].sparse_len()) {
        let rest: Vec<_> = whole
            .iter()
            .map(|c| HybridCache::from_view_after(hybrid, c.view(), p).unwrap())
            .collect();
        let split: Vec<_> = whole
            .iter()
            .zip(&rest)
            .map(|(w, r)| {
                let v = w.view();
                PrefixedHybrid {
                    prefix: (v.sparse_keys.first_rows(p), v.sparse_values.first_rows(p)),
                    view: r.view(),
                }
            })
            .collect();
        let what = format!("csr {layout:?} d={d} b={buffer} k={k} L={tokens} prefix={p}");
        let mut got_ref = vec![0.0; cfg.q_len()];
        Reference.hybrid(&cfg, &q, &split, &mut got_ref).unwrap();
        assert_eq!(got_ref, want_ref, "{what}: reference");
        for (name, mut e) in engines() {
            let (mut want, mut got) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
            e.hybrid(&cfg, &q, &whole, &mut want).unwrap();
            e.hybrid(&cfg, &q, &split, &mut got).unwrap();
            let exact = CpuAttention::exact_prefix_rows(p, hybrid.rows_per_block) == p;
            check(&got, &want, exact, max, &format!("{name} {what}"));
            assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &want_ref, max, &what);
        }
    }
}

#[test]
fn csr_prefix_matches_the_contiguous_history() {
    for layout in [(2, 2), (8, 1), (12, 1)] {
        for d in [64, 40, 12] {
            csr_case(layout, d, (16, d / 2, 200));
            csr_case(layout, d, (0, d / 4, 130));
        }
    }
}

fn coded_case<X: IndexCode, Y: ValueCode>(layout: (usize, usize), d: usize, tokens: usize) {
    let cfg = cfg(layout, d);
    let k = (d / 2) & !1;
    let hybrid = HybridConfig { rows_per_block: 40, ..HybridConfig::new(d, 16, k) }
        .for_store::<CodedStore<X, Y>>();
    let mut max = 0.0f32;
    let whole: Vec<CodedHybridCache<X, Y, f16>> = (0..layout.1 as u64)
        .map(|h| {
            let mut c = CodedHybridCache::new(hybrid).unwrap();
            let (k, v) = (synth::values(tokens * d, 9 + h), synth::values(tokens * d, 19 + h));
            max = max.max(bound(&v));
            c.extend(&k, &v).unwrap();
            c
        })
        .collect();
    let q = synth::values(cfg.q_len(), 5);
    let mut want_ref = vec![0.0; cfg.q_len()];
    Reference.coded_hybrid(&cfg, &q, &whole, &mut want_ref).unwrap();
    for p in splits(whole[0].sparse_len()) {
        let rest: Vec<_> = whole
            .iter()
            .map(|c| CodedHybridCache::from_view_after(hybrid, c.view(), p).unwrap())
            .collect();
        let split: Vec<_> = whole
            .iter()
            .zip(&rest)
            .map(|(w, r)| {
                let v = w.view();
                PrefixedCodedHybrid {
                    prefix: (v.sparse_keys.first_rows(p), v.sparse_values.first_rows(p)),
                    view: r.view(),
                }
            })
            .collect();
        let what = format!("{:?}×{:?} {layout:?} d={d} L={tokens} prefix={p}", X::KIND, Y::KIND);
        let mut got_ref = vec![0.0; cfg.q_len()];
        Reference.coded_hybrid(&cfg, &q, &split, &mut got_ref).unwrap();
        assert_eq!(got_ref, want_ref, "{what}: reference");
        for (name, mut e) in engines() {
            let (mut want, mut got) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
            e.coded_hybrid(&cfg, &q, &whole, &mut want).unwrap();
            e.coded_hybrid(&cfg, &q, &split, &mut got).unwrap();
            check(&got, &want, p.is_multiple_of(TILE), max, &format!("{name} {what}"));
        }
    }
}

#[test]
fn coded_prefix_matches_the_contiguous_history() {
    for layout in [(2, 2), (8, 1)] {
        // 64 and 40: the placing kernels (8-bit codes); 12: the expanding path.
        for d in [64, 40, 12] {
            coded_case::<Bitmask, Int8Values>(layout, d, 180);
            coded_case::<Bitmask, Elems<Fp8E4M3>>(layout, d, 180);
            coded_case::<List<u8>, Int8Values>(layout, d, 150);
            coded_case::<List<u8>, Elems<f16>>(layout, d, 150);
            coded_case::<Bitmask, Int4Values>(layout, d, 120);
        }
    }
}

#[test]
fn malformed_prefixes_are_typed_errors() {
    let (d, cfg) = (16, cfg((2, 1), 16));
    let hybrid = HybridConfig::new(d, 4, 8);
    let mut c = HybridCache::<u8, f16, f16>::new(hybrid).unwrap();
    c.extend(&synth::values(40 * d, 1), &synth::values(40 * d, 2)).unwrap();
    let v = c.view();
    let q = synth::values(cfg.q_len(), 3);
    let mut out = vec![0.0; cfg.q_len()];
    // Keys and values of the prefix hold different numbers of rows.
    let ragged = PrefixedHybrid {
        prefix: (v.sparse_keys.first_rows(5), v.sparse_values.first_rows(4)),
        view: v,
    };
    // A prefix of another head width.
    let mut wide = HybridCache::<u8, f16, f16>::new(HybridConfig::new(2 * d, 4, 8)).unwrap();
    wide.extend(&synth::values(20 * 2 * d, 4), &synth::values(20 * 2 * d, 5)).unwrap();
    let w = wide.view();
    let other = PrefixedHybrid { prefix: (w.sparse_keys, w.sparse_values), view: v };
    for (name, mut e) in engines() {
        let err = e.hybrid(&cfg, &q, &[ragged], &mut out).unwrap_err();
        assert!(matches!(err, Error::RowCountMismatch { kv_head: 0, .. }), "{name}: {err}");
        let err = e.hybrid(&cfg, &q, &[other], &mut out).unwrap_err();
        assert!(matches!(err, Error::HeadDimMismatch { kv_head: 0, .. }), "{name}: {err}");
    }
    assert!(Reference.hybrid(&cfg, &q, &[ragged], &mut out).is_err());

    let coded = HybridConfig::new(d, 4, 8).for_store::<CodedStore<Bitmask, Int8Values>>();
    let mut c = CodedHybridCache::<Bitmask, Int8Values, f16>::new(coded).unwrap();
    c.extend(&synth::values(40 * d, 6), &synth::values(40 * d, 7)).unwrap();
    let v = c.view();
    let ragged = PrefixedCodedHybrid {
        prefix: (v.sparse_keys.first_rows(3), v.sparse_values.first_rows(6)),
        view: v,
    };
    for (name, mut e) in engines() {
        let err = e.coded_hybrid(&cfg, &q, &[ragged], &mut out).unwrap_err();
        assert!(matches!(err, Error::RowCountMismatch { kv_head: 0, .. }), "{name}: {err}");
    }
}

fn quant_case<C: DenseCodec>(layout: (usize, usize), d: usize, rows: usize) {
    mixed_case::<C, C>(layout, d, rows);
}

/// Keys in `K`, values in `V`, in one part and split into a prefix and the rows after it.
fn mixed_case<K: DenseCodec, V: DenseCodec>(layout: (usize, usize), d: usize, rows: usize) {
    let cfg = cfg(layout, d);
    let q = synth::values(cfg.q_len(), 31);
    let heads: Vec<(Vec<f32>, Vec<f32>)> = (0..layout.1 as u64)
        .map(|h| (synth::values(rows * d, 40 + h), synth::values(rows * d, 50 + h)))
        .collect();
    fn store<C: DenseCodec>(d: usize, x: &[f32]) -> QuantRows<C> {
        let mut s = QuantRows::<C>::new(d).unwrap();
        s.push(x).unwrap();
        s
    }
    let (sk, sv) = (|x: &[f32]| store::<K>(d, x), |x: &[f32]| store::<V>(d, x));
    let whole: Vec<_> = heads.iter().map(|(k, v)| (sk(k), sv(v))).collect();
    let want_kv: Vec<_> = whole.iter().map(|(k, v)| QuantKv::new(k.view(), v.view())).collect();
    let mut want_ref = vec![0.0; cfg.q_len()];
    Reference.quantized(&cfg, &q, &want_kv, &mut want_ref).unwrap();
    for p in [0, 1, TILE, 45, rows] {
        let parts: Vec<_> = heads
            .iter()
            .map(|(k, v)| {
                let (k0, k1) = k.split_at(p * d);
                let (v0, v1) = v.split_at(p * d);
                ((sk(k0), sv(v0)), (sk(k1), sv(v1)))
            })
            .collect();
        let split: Vec<_> = parts
            .iter()
            .map(|((k0, v0), (k1, v1))| {
                QuantKv::continuing((k0.view(), v0.view()), k1.view(), v1.view())
            })
            .collect();
        let what = format!("{}/{} {layout:?} d={d} L={rows} prefix={p}", K::FORMAT, V::FORMAT);
        let mut got_ref = vec![0.0; cfg.q_len()];
        Reference.quantized(&cfg, &q, &split, &mut got_ref).unwrap();
        assert_eq!(got_ref, want_ref, "{what}: reference");
        for (name, mut e) in engines() {
            let (mut want, mut got) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
            e.quantized(&cfg, &q, &want_kv, &mut want).unwrap();
            e.quantized(&cfg, &q, &split, &mut got).unwrap();
            check(&got, &want, true, 1.0, &format!("{name} {what}"));
        }
    }
}

#[test]
fn quantized_rows_in_two_parts_attend_as_in_one() {
    for layout in [(2, 2), (8, 1)] {
        // Blocks of 32: d = 64 and 32; scaled fp8 rows of any width (40: 8-wide tails).
        for d in [64, 32] {
            quant_case::<Int8Blocks>(layout, d, 150);
            quant_case::<Int4Blocks>(layout, d, 150);
        }
        for d in [64, 40] {
            quant_case::<Fp8Rows>(layout, d, 150);
        }
        mixed_case::<Int8Blocks, Int4Blocks>(layout, 64, 150);
        mixed_case::<Fp8Rows, Int8Blocks>(layout, 32, 150);
    }
    // Keys and values of the prefix disagree: a typed error.
    let (d, cfg) = (32, cfg((2, 1), 32));
    let mut k = QuantRows::<Int8Blocks>::new(d).unwrap();
    k.push(&synth::values(4 * d, 1)).unwrap();
    let mut v = QuantRows::<Int8Blocks>::new(d).unwrap();
    v.push(&synth::values(3 * d, 2)).unwrap();
    let bad = QuantKv::continuing((k.view(), v.view()), k.view(), k.view());
    let mut out = vec![0.0; cfg.q_len()];
    for (name, mut e) in engines() {
        let err = e.quantized(&cfg, &synth::values(cfg.q_len(), 3), &[bad], &mut out).unwrap_err();
        assert!(matches!(err, Error::RowCountMismatch { kv_head: 0, .. }), "{name}: {err}");
    }
}

/// `sink` f32 rows, then `rows` quantized rows (some in a prefix): every engine against the
/// reference, which decodes the quantized rows and reads the sink rows as they are.
fn sink_case<C: DenseCodec>(layout: (usize, usize), d: usize, sink: usize, rows: usize) {
    let cfg = cfg(layout, d);
    let q = synth::values(cfg.q_len(), 61);
    let heads: Vec<[Vec<f32>; 4]> = (0..layout.1 as u64)
        .map(|h| {
            [0, 1, 2, 3].map(|i| synth::values(if i < 2 { sink } else { rows } * d, 70 + 4 * h + i))
        })
        .collect();
    let store = |x: &[f32]| {
        let mut s = QuantRows::<C>::new(d).unwrap();
        s.push(x).unwrap();
        s
    };
    let cut = rows / 3 * d;
    let stores: Vec<_> = heads
        .iter()
        .map(|[_, _, k, v]| {
            ((store(&k[..cut]), store(&v[..cut])), (store(&k[cut..]), store(&v[cut..])))
        })
        .collect();
    let kv: Vec<QuantKv<'_, C>> = heads
        .iter()
        .zip(&stores)
        .map(|([sk, sv, _, _], ((k0, v0), (k1, v1)))| {
            QuantKv::continuing((k0.view(), v0.view()), k1.view(), v1.view()).with_sink(sk, sv)
        })
        .collect();
    assert!(kv.iter().all(|h| h.num_rows() == sink + rows && h.sink_rows(d) == sink));
    let mut want = vec![0.0; cfg.q_len()];
    Reference.quantized(&cfg, &q, &kv, &mut want).unwrap();
    let max = heads.iter().fold(0.0f32, |m, [_, sv, _, v]| m.max(bound(sv)).max(bound(v)));
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.quantized(&cfg, &q, &kv, &mut got).unwrap();
        let what = format!("{name} {:?} {layout:?} d={d} sink={sink} rows={rows}", C::FORMAT);
        check(&got, &want, false, max, &what);
    }
    // Only sink rows stored: the dense kernel's attention over the same f32 rows.
    let (empty_k, empty_v) = (store(&[]), store(&[]));
    let only: Vec<_> = heads
        .iter()
        .map(|[sk, sv, _, _]| QuantKv::new(empty_k.view(), empty_v.view()).with_sink(sk, sv))
        .collect();
    let dense: Vec<_> =
        heads.iter().map(|[sk, sv, _, _]| attn_kernels::DenseKv::new(d, sk, sv)).collect();
    if sink > 0 {
        let what = format!("sink only d={d} sink={sink}");
        against_dense(&cfg, &q, &dense, max, &what, |e, out| e.quantized(&cfg, &q, &only, out));
    }
}

/// Every engine's `attend` against its own dense kernel over `dense`, within the hybrid
/// tolerance.
fn against_dense(
    cfg: &AttnConfig,
    q: &[f32],
    dense: &[attn_kernels::DenseKv<'_, f32>],
    max: f32,
    what: &str,
    attend: impl Fn(&mut CpuAttention, &mut [f32]) -> attn_kernels::Result<()>,
) {
    for (name, mut e) in engines() {
        let (mut a, mut b) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
        attend(&mut e, &mut a).unwrap();
        e.dense(cfg, q, dense, &mut b).unwrap();
        check(&a, &b, false, max, &format!("{name} {what}"));
    }
}

#[test]
fn sink_rows_attend_before_the_quantized_rows_under_one_softmax() {
    for layout in [(2, 2), (8, 1)] {
        for (sink, rows) in [(1, 150), (3, 40), (TILE + 1, 2 * TILE + 3), (4, 0)] {
            sink_case::<Int8Blocks>(layout, 64, sink, rows);
            sink_case::<Int4Blocks>(layout, 32, sink, rows);
            sink_case::<Fp8Rows>(layout, 40, sink, rows);
        }
    }
}

#[test]
fn malformed_sinks_are_typed_errors() {
    let (d, cfg) = (32, cfg((2, 1), 32));
    let mut k = QuantRows::<Int8Blocks>::new(d).unwrap();
    k.push(&synth::values(4 * d, 1)).unwrap();
    let (three, two, ragged) = (vec![0.5; 3 * d], vec![0.5; 2 * d], vec![0.5; d + 1]);
    let q = synth::values(cfg.q_len(), 3);
    let mut out = vec![0.0; cfg.q_len()];
    for (name, mut e) in engines() {
        let bad = QuantKv::new(k.view(), k.view()).with_sink(&three, &two);
        let err = e.quantized(&cfg, &q, &[bad], &mut out).unwrap_err();
        assert!(matches!(err, Error::RowCountMismatch { part: "sink", .. }), "{name}: {err}");
        let bad = QuantKv::new(k.view(), k.view()).with_sink(&ragged, &ragged);
        let err = e.quantized(&cfg, &q, &[bad], &mut out).unwrap_err();
        assert!(matches!(err, Error::RaggedRows { what: "sink keys", .. }), "{name}: {err}");
    }
}

/// `sink` f32 rows per head before a CSR hybrid head of `tokens` rows (the history split
/// after one tile when `prefixed`): every engine against the reference.
fn hybrid_sink_case(layout: (usize, usize), d: usize, sink: usize, prefixed: bool) {
    let (cfg, tokens) = (cfg(layout, d), 150);
    let hybrid = HybridConfig { rows_per_block: 64, ..HybridConfig::new(d, 16, d / 2) };
    let sinks: Vec<[Vec<f32>; 2]> = (0..layout.1 as u64)
        .map(|h| [0, 1].map(|i| synth::values(sink * d, 90 + 2 * h + i)))
        .collect();
    let whole: Vec<HybridCache<u8, f16, f16>> = (0..layout.1 as u64)
        .map(|h| {
            let mut c = HybridCache::new(hybrid).unwrap();
            c.extend(&synth::values(tokens * d, 3 * h), &synth::values(tokens * d, 3 * h + 1))
                .unwrap();
            c
        })
        .collect();
    let p = if prefixed { TILE } else { 0 };
    let rest: Vec<_> =
        whole.iter().map(|c| HybridCache::from_view_after(hybrid, c.view(), p).unwrap()).collect();
    let heads: Vec<_> = whole
        .iter()
        .zip(&rest)
        .zip(&sinks)
        .map(|((w, r), [sk, sv])| {
            let v = w.view();
            let prefix = (v.sparse_keys.first_rows(p), v.sparse_values.first_rows(p));
            WithSink { sink: (&sk[..], &sv[..]), head: PrefixedHybrid { prefix, view: r.view() } }
        })
        .collect();
    let q = synth::values(cfg.q_len(), 13);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.hybrid(&cfg, &q, &heads, &mut want).unwrap();
    // The sink changes the output: it is attended, not dropped.
    let mut without = vec![0.0; cfg.q_len()];
    Reference.hybrid(&cfg, &q, &whole, &mut without).unwrap();
    assert_ne!(want, without, "sink rows must take part in the softmax");
    let max = sinks.iter().fold(8.0f32, |m, [_, sv]| m.max(bound(sv)));
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.hybrid(&cfg, &q, &heads, &mut got).unwrap();
        let what = format!("{name} csr {layout:?} d={d} sink={sink} prefix={p}");
        check(&got, &want, false, max, &what);
    }
}

/// As [`hybrid_sink_case`] for coded rows `X`×`Y`.
fn coded_sink_case<X: IndexCode, Y: ValueCode>(layout: (usize, usize), d: usize, sink: usize) {
    let (cfg, tokens) = (cfg(layout, d), 120);
    let hybrid = HybridConfig { rows_per_block: 40, ..HybridConfig::new(d, 16, (d / 2) & !1) }
        .for_store::<CodedStore<X, Y>>();
    let sinks: Vec<[Vec<f32>; 2]> = (0..layout.1 as u64)
        .map(|h| [0, 1].map(|i| synth::values(sink * d, 40 + 2 * h + i)))
        .collect();
    let whole: Vec<CodedHybridCache<X, Y, f16>> = (0..layout.1 as u64)
        .map(|h| {
            let mut c = CodedHybridCache::new(hybrid).unwrap();
            c.extend(&synth::values(tokens * d, 7 + h), &synth::values(tokens * d, 17 + h))
                .unwrap();
            c
        })
        .collect();
    let p = TILE;
    let rest: Vec<_> = whole
        .iter()
        .map(|c| CodedHybridCache::from_view_after(hybrid, c.view(), p).unwrap())
        .collect();
    let prefixed: Vec<_> = whole
        .iter()
        .zip(&rest)
        .zip(&sinks)
        .map(|((w, r), [sk, sv])| {
            let v = w.view();
            let prefix = (v.sparse_keys.first_rows(p), v.sparse_values.first_rows(p));
            WithSink {
                sink: (&sk[..], &sv[..]),
                head: PrefixedCodedHybrid { prefix, view: r.view() },
            }
        })
        .collect();
    let plain: Vec<_> = whole
        .iter()
        .zip(&sinks)
        .map(|(w, [sk, sv])| WithSink { sink: (&sk[..], &sv[..]), head: w.view() })
        .collect();
    let q = synth::values(cfg.q_len(), 29);
    let (mut want, mut want_plain) = (vec![0.0; cfg.q_len()], vec![0.0; cfg.q_len()]);
    Reference.coded_hybrid(&cfg, &q, &prefixed, &mut want).unwrap();
    Reference.coded_hybrid(&cfg, &q, &plain, &mut want_plain).unwrap();
    assert_eq!(want, want_plain, "the reference decodes a split history as one");
    let max = sinks.iter().fold(8.0f32, |m, [_, sv]| m.max(bound(sv)));
    for (name, mut e) in engines() {
        let (mut a, mut b) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
        e.coded_hybrid(&cfg, &q, &prefixed, &mut a).unwrap();
        e.coded_hybrid(&cfg, &q, &plain, &mut b).unwrap();
        let what = format!("{name} {:?}×{:?} {layout:?} d={d} sink={sink}", X::KIND, Y::KIND);
        check(&a, &want, false, max, &what);
        check(&b, &want, false, max, &what);
    }
}

#[test]
fn sink_rows_attend_before_hybrid_heads_under_one_softmax() {
    for layout in [(2, 2), (8, 1)] {
        for (d, sink) in [(64, 1), (40, 3), (12, TILE + 1)] {
            hybrid_sink_case(layout, d, sink, false);
            hybrid_sink_case(layout, d, sink, true);
            coded_sink_case::<Bitmask, Int8Values>(layout, d, sink);
            coded_sink_case::<Bitmask, Elems<Fp8E4M3>>(layout, d, sink);
            coded_sink_case::<List<u8>, Int4Values>(layout, d, sink);
        }
    }
}

/// A lossless hybrid head (every component, f32 rows) with a sink attends as the dense
/// kernel over the sink's rows followed by the head's.
#[test]
fn a_lossless_hybrid_head_with_a_sink_equals_dense() {
    let (layout, d, sink, tokens) = ((4, 2), 32, 2, 100);
    let cfg = cfg(layout, d);
    let mut all: Vec<[Vec<f32>; 2]> = Vec::new();
    let mut heads = Vec::new();
    for h in 0..layout.1 as u64 {
        let (k, v) = (
            synth::values((sink + tokens) * d, 50 + h),
            synth::values((sink + tokens) * d, 60 + h),
        );
        let mut c = HybridCache::<u8, f32, f32>::new(HybridConfig::new(d, 8, d)).unwrap();
        c.extend(&k[sink * d..], &v[sink * d..]).unwrap();
        heads.push(c);
        all.push([k, v]);
    }
    let with: Vec<_> = heads
        .iter()
        .zip(&all)
        .map(|(c, [k, v])| WithSink { sink: (&k[..sink * d], &v[..sink * d]), head: c.view() })
        .collect();
    let dense: Vec<_> = all.iter().map(|[k, v]| attn_kernels::DenseKv::new(d, k, v)).collect();
    let q = synth::values(cfg.q_len(), 8);
    let max = all.iter().fold(0.0f32, |m, [_, v]| m.max(bound(v)));
    let what = "lossless hybrid with a sink";
    against_dense(&cfg, &q, &dense, max, what, |e, out| e.hybrid(&cfg, &q, &with, out));
}

#[test]
fn malformed_hybrid_sinks_are_typed_errors() {
    let (d, cfg) = (32, cfg((2, 1), 32));
    let mut c = HybridCache::<u8, f16, f16>::new(HybridConfig::new(d, 4, d / 2)).unwrap();
    c.extend(&synth::values(10 * d, 1), &synth::values(10 * d, 2)).unwrap();
    let hybrid = HybridConfig::new(d, 4, d / 2).for_store::<CodedStore<Bitmask, Int8Values>>();
    let mut coded = CodedHybridCache::<Bitmask, Int8Values, f16>::new(hybrid).unwrap();
    coded.extend(&synth::values(10 * d, 1), &synth::values(10 * d, 2)).unwrap();
    let (three, two, ragged) = (vec![0.5; 3 * d], vec![0.5; 2 * d], vec![0.5; d + 1]);
    let q = synth::values(cfg.q_len(), 3);
    let mut out = vec![0.0; cfg.q_len()];
    for (name, mut e) in engines() {
        let bad = WithSink { sink: (&three[..], &two[..]), head: c.view() };
        let err = e.hybrid(&cfg, &q, &[bad], &mut out).unwrap_err();
        assert!(matches!(err, Error::RowCountMismatch { part: "sink", .. }), "{name}: {err}");
        let bad = WithSink { sink: (&ragged[..], &ragged[..]), head: coded.view() };
        let err = e.coded_hybrid(&cfg, &q, &[bad], &mut out).unwrap_err();
        assert!(matches!(err, Error::RaggedRows { what: "sink keys", .. }), "{name}: {err}");
    }
    let bad = WithSink { sink: (&three[..], &two[..]), head: coded.view() };
    let err = Reference.coded_hybrid(&cfg, &q, &[bad], &mut out).unwrap_err();
    assert!(matches!(err, Error::RowCountMismatch { part: "sink", .. }), "reference: {err}");
}
