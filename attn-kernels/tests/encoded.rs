//! The kernels over encoded rows — dense int8 / int4 / scaled-fp8 and SWAN's hybrid cache
//! over coded rows (bitmask or list × float or integer values) — against the reference on
//! every GQA layout, and the lossless coded setting against dense attention.

mod common;

use attn_kernels::accuracy::Kernel;
use attn_kernels::{
    CpuAttention, DecodeAttention, DenseKv, EncodedAttention, Error, Isa, QuantKv, QueryPrecision,
    Reference, synth,
};
use common::{LAYOUTS, assert_close, cfg, engines};
use half::f16;
use kv_sparse::ValueFormat;
use kv_sparse::coded::{
    Bitmask, CodedStore, Elems, IndexCode, Int4Values, Int8Values, List, ValueCode,
};
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, HybridConfig};
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};

fn bound(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

fn quant_case<C: DenseCodec>(layout: (usize, usize), d: usize, rows: usize, seed: u64) {
    mixed_case::<C, C>(layout, d, rows, seed);
}

/// Keys encoded by `K`, values by `V`, against the reference on every engine.
fn mixed_case<K: DenseCodec, V: DenseCodec>(
    layout: (usize, usize),
    d: usize,
    rows: usize,
    seed: u64,
) {
    let cfg = cfg(layout, d);
    let mut stores = Vec::new();
    let mut max = 0.0f32;
    for h in 0..layout.1 as u64 {
        let (k, v) =
            (synth::values(rows * d, seed + 2 * h), synth::values(rows * d, seed + 2 * h + 1));
        max = max.max(bound(&v));
        let (mut ks, mut vs) = (QuantRows::<K>::new(d).unwrap(), QuantRows::<V>::new(d).unwrap());
        ks.push(&k).unwrap();
        vs.push(&v).unwrap();
        stores.push((ks, vs));
    }
    let kv: Vec<QuantKv<'_, K, V>> =
        stores.iter().map(|(k, v)| QuantKv::new(k.view(), v.view())).collect();
    let q = synth::values(cfg.q_len(), seed + 99);
    let mut want = vec![0.0; cfg.q_len()];
    Reference.quantized(&cfg, &q, &kv, &mut want).unwrap();
    for (name, mut e) in engines() {
        let mut got = vec![f32::NAN; cfg.q_len()];
        e.quantized(&cfg, &q, &kv, &mut got).unwrap();
        let what = format!("{name} {}/{} {layout:?} d={d} rows={rows}", K::FORMAT, V::FORMAT);
        assert_close(Kernel::Dense, ValueFormat::F32, &got, &want, max, &what);
    }
}

#[test]
fn quantized_dense_every_codec_and_layout() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for (j, (d, rows)) in [(32, 1), (64, 100), (128, 45)].into_iter().enumerate() {
            let seed = 1000 * i as u64 + 10 * j as u64;
            quant_case::<Int8Blocks>(layout, d, rows, seed);
            quant_case::<Int4Blocks>(layout, d, rows, seed + 1);
            quant_case::<Fp8Rows>(layout, d, rows, seed + 2);
        }
        // Scaled-fp8 rows of any width: 8-wide tails (40) and widths the 8-lane kernels
        // leave to the decoding path (20).
        for (d, rows) in [(40, 33), (20, 5)] {
            quant_case::<Fp8Rows>(layout, d, rows, 7000 + i as u64);
        }
    }
}

/// Keys and values in different codecs (llama.cpp's `-ctk` / `-ctv` pairs): the key codec
/// picks the score kernel, the value codec the accumulation kernel, on every engine.
#[test]
fn quantized_dense_keys_and_values_in_different_codecs() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for (j, (d, rows)) in [(32, 1), (64, 100), (128, 45)].into_iter().enumerate() {
            let seed = 5000 + 1000 * i as u64 + 10 * j as u64;
            mixed_case::<Int8Blocks, Int4Blocks>(layout, d, rows, seed);
            mixed_case::<Int4Blocks, Int8Blocks>(layout, d, rows, seed + 1);
            mixed_case::<Int8Blocks, Fp8Rows>(layout, d, rows, seed + 2);
            mixed_case::<Fp8Rows, Int4Blocks>(layout, d, rows, seed + 3);
            mixed_case::<Int4Blocks, Fp8Rows>(layout, d, rows, seed + 4);
            mixed_case::<Fp8Rows, Int8Blocks>(layout, d, rows, seed + 5);
        }
    }
}

/// A mixed head equals the same rows decoded to f32 in the dense kernel: keys and values
/// are each read by their own codec, not the other's.
#[test]
fn mixed_codecs_read_each_side_by_its_own_codec() {
    let (d, rows) = (64, 70);
    let cfg = cfg((4, 2), d);
    let (mut keys, mut values, mut dk, mut dv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for h in 0..2u64 {
        let (k, v) = (synth::values(rows * d, 40 + h), synth::values(rows * d, 50 + h));
        let (mut ks, mut vs) =
            (QuantRows::<Int8Blocks>::new(d).unwrap(), QuantRows::<Int4Blocks>::new(d).unwrap());
        ks.push(&k).unwrap();
        vs.push(&v).unwrap();
        let (mut kd, mut vd) = (vec![0.0f32; rows * d], vec![0.0f32; rows * d]);
        for r in 0..rows {
            Int8Blocks::decode(ks.view().row(r).unwrap(), &mut kd[r * d..(r + 1) * d]);
            Int4Blocks::decode(vs.view().row(r).unwrap(), &mut vd[r * d..(r + 1) * d]);
        }
        keys.push(ks);
        values.push(vs);
        dk.push(kd);
        dv.push(vd);
    }
    let kv: Vec<_> =
        keys.iter().zip(&values).map(|(k, v)| QuantKv::new(k.view(), v.view())).collect();
    let dense: Vec<_> = dk.iter().zip(&dv).map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let q = synth::values(cfg.q_len(), 77);
    let max = dv.iter().map(|v| bound(v)).fold(0.0, f32::max);
    for (name, mut e) in engines() {
        let (mut got, mut want) = (vec![f32::NAN; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
        e.quantized(&cfg, &q, &kv, &mut got).unwrap();
        e.dense(&cfg, &q, &dense, &mut want).unwrap();
        assert_close(
            Kernel::Dense,
            ValueFormat::F32,
            &got,
            &want,
            max,
            &format!("{name} int8/int4"),
        );
    }
}

type Caches<X, Y> = Vec<CodedHybridCache<X, Y, f16>>;

fn coded_caches<X: IndexCode, Y: ValueCode>(
    kv_heads: usize,
    d: usize,
    (buffer, k, tokens): (usize, usize, usize),
    scale: Option<(f32, f32)>,
    seed: u64,
) -> (Caches<X, Y>, f32) {
    let cfg = HybridConfig { fp8_scale: scale, ..HybridConfig::new(d, buffer, k) }
        .for_store::<CodedStore<X, Y>>();
    let mut max = 0.0f32;
    let caches = (0..kv_heads as u64)
        .map(|h| {
            let mut c = CodedHybridCache::<X, Y, f16>::new(cfg).unwrap();
            let (k, v) = (
                synth::values(tokens * d, seed + 2 * h),
                synth::values(tokens * d, seed + 2 * h + 1),
            );
            max = max.max(bound(&v));
            c.extend(&k, &v).unwrap();
            c
        })
        .collect();
    (caches, max)
}

fn coded_case<X: IndexCode, Y: ValueCode>(layout: (usize, usize), d: usize, seed: u64) {
    let cfg = cfg(layout, d);
    // (b, k, tokens): history and buffer, history only, buffer only, one token.
    for (b, k, tokens) in [(16, d / 2, 90), (0, d / 4 * 2, 40), (64, 2, 30), (4, d, 1)] {
        for scale in [None, Some((0.5, 2.0))] {
            let (caches, max) = coded_caches::<X, Y>(layout.1, d, (b, k, tokens), scale, seed);
            let q = synth::values(cfg.q_len(), seed + 7);
            let mut want = vec![0.0; cfg.q_len()];
            Reference.coded_hybrid(&cfg, &q, &caches, &mut want).unwrap();
            for (name, mut e) in engines() {
                let mut got = vec![f32::NAN; cfg.q_len()];
                e.coded_hybrid(&cfg, &q, &caches, &mut got).unwrap();
                let what = format!(
                    "{name} {:?}×{:?} {layout:?} d={d} b={b} k={k} L={tokens} scale={scale:?}",
                    X::KIND,
                    Y::KIND
                );
                let bound = max * scale.map_or(1.0, |s| s.1.max(1.0));
                assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &want, bound, &what);
            }
        }
    }
}

#[test]
fn coded_hybrid_every_encoding_and_layout() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        // 40: an odd number of mask bytes; 12: a width the placing kernels leave to the
        // expanding path; 64 and 128: one and two mask words, read in place by the AVX-512
        // kernels.
        for (j, d) in [16usize, 64, 24, 40, 12, 128].into_iter().enumerate() {
            let seed = 500 * i as u64 + 50 * j as u64;
            coded_case::<List<u8>, Elems<f16>>(layout, d, seed);
            coded_case::<List<u8>, Elems<Fp8E4M3>>(layout, d, seed + 1);
            coded_case::<List<u16>, Int8Values>(layout, d, seed + 2);
            coded_case::<Bitmask, Elems<f16>>(layout, d, seed + 3);
            coded_case::<Bitmask, Elems<Fp8E4M3>>(layout, d, seed + 4);
            coded_case::<Bitmask, Int8Values>(layout, d, seed + 5);
            coded_case::<Bitmask, Int4Values>(layout, d, seed + 6);
            coded_case::<List<u8>, Int4Values>(layout, d, seed + 7);
        }
        // Int4 rows are read in place up to 256 components and expanded beyond.
        for (j, d) in [256usize, 264].into_iter().enumerate() {
            let seed = 500 * i as u64 + 50 * j as u64 + 300;
            coded_case::<Bitmask, Int4Values>(layout, d, seed);
            coded_case::<List<u16>, Int4Values>(layout, d, seed + 1);
        }
    }
}

/// `k = head_dim`, f32 values, no buffer: the coded kernels read exactly the dense rows and
/// run them through the same tiles, so the output equals dense f32 attention bit for bit.
fn lossless_case<X: IndexCode>(layout: (usize, usize), d: usize, tokens: usize) {
    let cfg = cfg(layout, d);
    let (caches, _) = coded_caches::<X, Elems<f32>>(layout.1, d, (0, d, tokens), None, 3);
    let rows: Vec<(Vec<f32>, Vec<f32>)> = (0..layout.1 as u64)
        .map(|h| (synth::values(tokens * d, 3 + 2 * h), synth::values(tokens * d, 4 + 2 * h)))
        .collect();
    let dense: Vec<DenseKv<'_, f32>> = rows.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
    let q = synth::values(cfg.q_len(), 11);
    for threads in [1, 2] {
        let mut e = CpuAttention::new(threads).unwrap();
        let (mut a, mut b) = (vec![0.0; cfg.q_len()], vec![0.0; cfg.q_len()]);
        e.coded_hybrid(&cfg, &q, &caches, &mut a).unwrap();
        e.dense(&cfg, &q, &dense, &mut b).unwrap();
        assert_eq!(a, b, "{:?} {layout:?} d={d} L={tokens}", X::KIND);
    }
}

#[test]
fn lossless_coded_rows_equal_dense() {
    for &layout in &LAYOUTS {
        for (d, tokens) in [(64, 300), (24, 17)] {
            lossless_case::<Bitmask>(layout, d, tokens);
            lossless_case::<List<u8>>(layout, d, tokens);
        }
    }
}

/// `q` rounded per head as [`QueryPrecision::Int8`] rounds it: `σ_h · round(q_h / σ_h)`.
fn rounded_queries(q: &[f32], d: usize) -> Vec<f32> {
    q.chunks_exact(d)
        .flat_map(|qh| {
            let sigma = bound(qh) / 127.0;
            qh.iter().map(move |x| if sigma > 0.0 { (x / sigma).round() * sigma } else { 0.0 })
        })
        .collect()
}

/// Engines with int8 queries on every instruction set that runs them (AVX2's integer
/// products, AVX-512 VNNI's where present), one and two threads; none (with a printed
/// reason) on a CPU without them.
fn int8_query_engines() -> Vec<(String, CpuAttention)> {
    if !QueryPrecision::Int8.is_available() {
        println!("SKIPPED: int8 queries need AVX2 on this CPU");
        return Vec::new();
    }
    let isas: Vec<Isa> = Isa::available().filter(|&i| i != Isa::Portable).collect();
    isas.into_iter()
        .flat_map(|isa| {
            [(1, CpuAttention::DEFAULT_SPLIT_ROWS), (2, 37)].into_iter().map(move |(t, split)| {
                let e = CpuAttention::new(t).unwrap().with_isa(isa).unwrap();
                let e = e.with_query_precision(QueryPrecision::Int8).unwrap();
                (format!("int8-q/{isa}/{t}t/split{split}"), e.with_split_rows(split).unwrap())
            })
        })
        .collect()
}

/// With int8 queries the kernels attend as exact products with the queries rounded to
/// their int8 codes do, over int8 and 4-bit keys: the integer sums are exact, so only the
/// rounding of `q` differs from f32 queries.
#[test]
fn int8_queries_attend_as_the_rounded_queries_do() {
    let mut engines = int8_query_engines();
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for (j, d) in [64usize, 128].into_iter().enumerate() {
            let seed = 9000 + 100 * i as u64 + 10 * j as u64;
            let cfg = cfg(layout, d);
            let q = synth::values(cfg.q_len(), seed + 7);
            let qr = rounded_queries(&q, d);
            // Dense q8_0 and q4_0 rows: integer products.
            let rows = 150;
            let mut stores = Vec::new();
            let mut max = 0.0f32;
            for h in 0..layout.1 as u64 {
                let (k, v) = (
                    synth::values(rows * d, seed + 2 * h),
                    synth::values(rows * d, seed + 2 * h + 1),
                );
                max = max.max(bound(&v));
                let mut ks = QuantRows::<Int8Blocks>::new(d).unwrap();
                let mut vs = QuantRows::<Int8Blocks>::new(d).unwrap();
                ks.push(&k).unwrap();
                vs.push(&v).unwrap();
                let (mut k4, mut v4) = (
                    QuantRows::<Int4Blocks>::new(d).unwrap(),
                    QuantRows::<Int4Blocks>::new(d).unwrap(),
                );
                k4.push(&k).unwrap();
                v4.push(&v).unwrap();
                stores.push((ks, vs, k4, v4));
            }
            let kv8: Vec<QuantKv<'_, Int8Blocks>> =
                stores.iter().map(|s| QuantKv::new(s.0.view(), s.1.view())).collect();
            let kv4: Vec<QuantKv<'_, Int4Blocks>> =
                stores.iter().map(|s| QuantKv::new(s.2.view(), s.3.view())).collect();
            let (mut want8, mut want4) = (vec![0.0; cfg.q_len()], vec![0.0; cfg.q_len()]);
            Reference.quantized(&cfg, &qr, &kv8, &mut want8).unwrap();
            Reference.quantized(&cfg, &qr, &kv4, &mut want4).unwrap();
            // Histories of bitmask and list rows with int8 values (no dense buffer: its f16
            // rows take the f32 queries).
            let (bm, bm_max) =
                coded_caches::<Bitmask, Int8Values>(layout.1, d, (0, d / 2, 120), None, seed);
            let (ls, ls_max) =
                coded_caches::<List<u8>, Int8Values>(layout.1, d, (0, d / 4, 90), None, seed + 1);
            let (mut want_bm, mut want_ls) = (vec![0.0; cfg.q_len()], vec![0.0; cfg.q_len()]);
            Reference.coded_hybrid(&cfg, &qr, &bm, &mut want_bm).unwrap();
            Reference.coded_hybrid(&cfg, &qr, &ls, &mut want_ls).unwrap();
            for (name, e) in &mut engines {
                let what = format!("{name} {layout:?} d={d}");
                let mut got = vec![f32::NAN; cfg.q_len()];
                e.quantized(&cfg, &q, &kv8, &mut got).unwrap();
                assert_close(Kernel::Dense, ValueFormat::F32, &got, &want8, max, &what);
                e.quantized(&cfg, &q, &kv4, &mut got).unwrap();
                assert_close(Kernel::Dense, ValueFormat::F32, &got, &want4, max, &what);
                e.coded_hybrid(&cfg, &q, &bm, &mut got).unwrap();
                assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &want_bm, bm_max, &what);
                e.coded_hybrid(&cfg, &q, &ls, &mut got).unwrap();
                assert_close(Kernel::Hybrid, ValueFormat::F32, &got, &want_ls, ls_max, &what);
            }
        }
    }
}

/// `q` rounded as ggml's `q8_0` rounds it, from the format's definition: per run of 32
/// elements of a head (a short last run alone), `σ = max|q|/127`, codes
/// `round(q · 127 / max|q|)` (halves away from zero), values `f16(σ) · code`.
fn q8_0_queries(q: &[f32], d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(q.len());
    for head in q.chunks_exact(d) {
        for run in head.chunks(32) {
            let amax = bound(run);
            let scale = f16::from_f32(amax / 127.0).to_f32();
            out.extend(
                run.iter().map(
                    |x| {
                        if amax == 0.0 { 0.0 } else { (x * 127.0 / amax).round() * scale }
                    },
                ),
            );
        }
    }
    out
}

/// With `q8_0` queries every kernel attends exactly as it does, with f32 queries, to the
/// queries rounded to `q8_0` blocks — whatever the keys' format (f32, `q8_0`, `q4_0`), on
/// every engine — and a head size that is not a multiple of 32 rounds its last run alone.
#[test]
fn q8_0_queries_attend_as_the_queries_rounded_to_q8_0_blocks() {
    for (i, &layout) in LAYOUTS.iter().enumerate() {
        for (j, d) in [64usize, 128, 40].into_iter().enumerate() {
            let seed = 9500 + 100 * i as u64 + 10 * j as u64;
            let cfg = cfg(layout, d);
            let q = synth::values(cfg.q_len(), seed + 7);
            let qr = q8_0_queries(&q, d);
            assert_ne!(q, qr);
            let rows = 130;
            let keys: Vec<(Vec<f32>, Vec<f32>)> = (0..layout.1 as u64)
                .map(|h| {
                    (
                        synth::values(rows * d, seed + 2 * h),
                        synth::values(rows * d, seed + 2 * h + 1),
                    )
                })
                .collect();
            let dense: Vec<DenseKv<'_, f32>> =
                keys.iter().map(|(k, v)| DenseKv::new(d, k, v)).collect();
            for (name, mut e) in engines() {
                let what = format!("{name} {layout:?} d={d}");
                let (mut want, mut got) = (vec![0.0; cfg.q_len()], vec![f32::NAN; cfg.q_len()]);
                e.dense(&cfg, &qr, &dense, &mut want).unwrap();
                let mut r = e.with_query_precision(QueryPrecision::Q8Blocks).unwrap();
                assert_eq!(r.query_precision(), QueryPrecision::Q8Blocks);
                r.dense(&cfg, &q, &dense, &mut got).unwrap();
                assert_eq!(got, want, "{what} dense f32");
                if d % 32 == 0 {
                    let mut stores = Vec::new();
                    for (k, v) in &keys {
                        let mut k4 = QuantRows::<Int4Blocks>::new(d).unwrap();
                        let mut v8 = QuantRows::<Int8Blocks>::new(d).unwrap();
                        k4.push(k).unwrap();
                        v8.push(v).unwrap();
                        let mut k8 = QuantRows::<Int8Blocks>::new(d).unwrap();
                        k8.push(k).unwrap();
                        stores.push((k4, v8, k8));
                    }
                    let kv4: Vec<QuantKv<'_, Int4Blocks, Int8Blocks>> =
                        stores.iter().map(|s| QuantKv::new(s.0.view(), s.1.view())).collect();
                    let kv8: Vec<QuantKv<'_, Int8Blocks>> =
                        stores.iter().map(|s| QuantKv::new(s.2.view(), s.1.view())).collect();
                    r.set_query_precision(QueryPrecision::F32).unwrap();
                    r.quantized(&cfg, &qr, &kv4, &mut want).unwrap();
                    r.set_query_precision(QueryPrecision::Q8Blocks).unwrap();
                    r.quantized(&cfg, &q, &kv4, &mut got).unwrap();
                    assert_eq!(got, want, "{what} q4_0 keys");
                    r.set_query_precision(QueryPrecision::F32).unwrap();
                    r.quantized(&cfg, &qr, &kv8, &mut want).unwrap();
                    r.set_query_precision(QueryPrecision::Q8Blocks).unwrap();
                    r.quantized(&cfg, &q, &kv8, &mut got).unwrap();
                    assert_eq!(got, want, "{what} q8_0 keys");
                }
            }
        }
    }
    // A run with a non-finite query stays as it is (the attention itself then says so).
    let cfg = cfg((1, 1), 32);
    let (k, v) = (synth::values(3 * 32, 1), synth::values(3 * 32, 2));
    let kv = [DenseKv::new(32, &k, &v)];
    let mut e =
        CpuAttention::new(1).unwrap().with_query_precision(QueryPrecision::Q8Blocks).unwrap();
    let mut q = synth::values(32, 3);
    q[5] = f32::INFINITY;
    let mut out = vec![0.0; 32];
    let _ = e.dense(&cfg, &q, &kv, &mut out);
}

#[test]
fn query_precision_is_lossless_unless_asked_and_refused_where_it_cannot_run() {
    let e = CpuAttention::new(1).unwrap();
    assert_eq!(e.query_precision(), QueryPrecision::F32);
    let portable = e.with_isa(Isa::Portable).unwrap();
    assert!(matches!(
        portable.with_query_precision(QueryPrecision::Int8),
        Err(Error::Param { what: "precision", .. })
    ));
    if QueryPrecision::Int8.is_available() {
        let e = CpuAttention::new(1).unwrap().with_isa(Isa::Avx2).unwrap();
        let e = e.with_query_precision(QueryPrecision::Int8).unwrap();
        let e = e.with_isa(Isa::Avx2).unwrap();
        assert_eq!(e.query_precision(), QueryPrecision::Int8);
        assert!(matches!(e.with_isa(Isa::Portable), Err(Error::Param { what: "isa", .. })));
    }
    assert_eq!("f32".parse(), Ok(QueryPrecision::F32));
    assert!("int4".parse::<QueryPrecision>().is_err());
    // q8_0 blocks run on every instruction set and back to f32 on request.
    let e = CpuAttention::new(1).unwrap().with_isa(Isa::Portable).unwrap();
    let mut e = e.with_query_precision(QueryPrecision::Q8Blocks).unwrap();
    assert_eq!(e.query_precision(), QueryPrecision::Q8Blocks);
    assert!(QueryPrecision::Q8Blocks.is_available());
    e.set_query_precision(QueryPrecision::F32).unwrap();
    assert_eq!(e.query_precision(), QueryPrecision::F32);
    assert_eq!("q8_0".parse(), Ok(QueryPrecision::Q8Blocks));
    assert_eq!(QueryPrecision::Q8Blocks.to_string(), "q8_0");
}

#[test]
fn bad_encoded_inputs_are_typed_errors() {
    let cfg = cfg((2, 1), 32);
    let q = vec![0.1; 64];
    let mut out = vec![0.0; 64];
    let empty = QuantRows::<Int8Blocks>::new(32).unwrap();
    let kv = [QuantKv::new(empty.view(), empty.view())];
    assert!(matches!(
        CpuAttention::new(1).unwrap().quantized(&cfg, &q, &kv, &mut out),
        Err(Error::EmptyCache { .. })
    ));
    let mut other = QuantRows::<Int8Blocks>::new(64).unwrap();
    other.push(&[0.5; 64]).unwrap();
    let kv = [QuantKv::new(other.view(), other.view())];
    assert!(matches!(
        Reference.quantized(&cfg, &q, &kv, &mut out),
        Err(Error::HeadDimMismatch { .. })
    ));
    let (caches, _) = coded_caches::<Bitmask, Int8Values>(1, 32, (4, 8, 10), None, 1);
    let mut bad_q = q.clone();
    bad_q[3] = f32::NAN;
    assert!(matches!(
        CpuAttention::new(1).unwrap().coded_hybrid(&cfg, &bad_q, &caches, &mut out),
        Err(Error::NonFiniteQuery { .. })
    ));
    let two = [caches[0].clone(), caches[0].clone()];
    assert!(matches!(
        Reference.coded_hybrid(&cfg, &q, &two, &mut out),
        Err(Error::LengthMismatch { .. })
    ));
}

/// Drawn layouts and rows with keys and values in different codecs: the CPU kernel within
/// the dense tolerance of the reference.
#[test]
fn drawn_mixed_codec_cases_match_the_reference() {
    use attn_kernels::accuracy::{output_error, tolerance};
    use attn_kernels::strategies::{Limits, mixed_quant_case};
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config { cases: 48, ..Config::default() });
    let strategy = mixed_quant_case::<Int8Blocks, Int4Blocks>(Limits::default());
    runner
        .run(&strategy, |case| {
            let n = case.cfg.q_len();
            let (mut want, mut got) = (vec![0.0; n], vec![0.0; n]);
            Reference.quantized(&case.cfg, &case.q, &case.views(), &mut want).unwrap();
            CpuAttention::new(2)
                .unwrap()
                .quantized(&case.cfg, &case.q, &case.views(), &mut got)
                .unwrap();
            let tol = tolerance(Kernel::Dense, ValueFormat::F32).output;
            proptest::prop_assert!(output_error(&got, &want, case.value_bound()) <= tol);
            Ok(())
        })
        .unwrap();
}
