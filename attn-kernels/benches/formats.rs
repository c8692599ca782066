//! Criterion benches of one decode step over the encoded formats, each beside dense f16
//! measured in the same run: dense int8 (q8_0 blocks), int4 (q4_0 blocks) and fp8 rows
//! with a per-token scale, and SWAN hybrid caches with bitmask rows (fp8, int8, int4 or f16
//! values, k = d/2, b = 128 dense f16 rows), KIVI-2 (groups of 32) and TurboQuant-style
//! 3-bit rows behind the same buffer — read in place, and through their row decoders
//! (`…_decoded`) as the baseline of that path. 32 q-heads / 8 kv-heads, d_h ∈ {64, 128},
//! L ∈ {4k, 32k}. `Throughput::Bytes` is the bytes each step reads as stored (scales,
//! masks, offsets and block bases included), so criterion reports bandwidth. On CPUs with
//! AVX-512 VBMI2 the bitmask rows are also timed with the AVX2 placement (`…_pshufb`), and
//! where the 512-bit products run ([`Isa::Avx512`]) dense f16, dense int8 and the 8-bit
//! bitmask rows are also timed with the AVX2 products (`…_avx2`), so each pair compares in
//! one run.
//!
//! `cargo bench -p attn-kernels --bench formats` (single-threaded); `ATTN_BENCH_THREADS=2`
//! for two threads, `ATTN_BENCH_QUICK=1` for a short smoke run (d = 64, L = 4k).

mod common;

use std::time::Duration;

use attn_kernels::{CpuAttention, DecodedKv, EncodedAttention, Isa, QuantKv, synth};
use common::{BUFFER, KV_HEADS, Q_HEADS};
use criterion::{Criterion, criterion_group, criterion_main};
use half::f16;
use kv_sparse::coded::{Bitmask, CodedStore, Elems, Int4Values, Int8Values, ValueCode};
use kv_sparse::decoded::DecodeRows;
use kv_sparse::fp8::Fp8E4M3;
use kv_sparse::hybrid::{CodedHybridCache, Hybrid, HybridConfig, RowStore};
use kv_sparse::kivi::KiviRows;
use kv_sparse::quant::{DenseCodec, Fp8Rows, Int4Blocks, Int8Blocks, QuantRows};
use kv_sparse::turbo::TurboRows;

/// Seed offset of the synthetic keys and values.
const SEED: u64 = 11;

fn grid() -> (Vec<usize>, Vec<usize>) {
    if common::quick() { (vec![64], vec![4096]) } else { (vec![64, 128], vec![4096, 32768]) }
}

fn quant<C: DenseCodec>(
    c: &mut Criterion,
    attn: &mut CpuAttention,
    (d, len): (usize, usize),
    q: &[f32],
    label: &str,
) {
    let cfg = common::layout(d);
    let rows = |x: &[f32]| {
        let mut r = QuantRows::<C>::new(d).expect("head_dim");
        r.push(x).expect("finite rows");
        r
    };
    let heads: Vec<(QuantRows<C>, QuantRows<C>)> = (0..KV_HEADS as u64)
        .map(|h| {
            let (k, v) = common::keys_values(len, d, h, SEED);
            (rows(&k), rows(&v))
        })
        .collect();
    let bytes: usize =
        heads.iter().map(|(k, v)| k.memory().held_bytes() + v.memory().held_bytes()).sum();
    let kv: Vec<QuantKv<'_, C>> =
        heads.iter().map(|(k, v)| QuantKv::new(k.view(), v.view())).collect();
    let mut out = vec![0.0; cfg.q_len()];
    common::time_step(c, format!("dense_{label}_d{d}"), len, bytes, || {
        attn.quantized(&cfg, q, &kv, &mut out).expect("decode")
    });
}

fn bitmask<Y: ValueCode>(
    c: &mut Criterion,
    attn: &mut CpuAttention,
    (d, len): (usize, usize),
    q: &[f32],
    label: &str,
) {
    let cfg = common::layout(d);
    let k = d / 2;
    let caches: Vec<CodedHybridCache<Bitmask, Y, f16>> = (0..KV_HEADS as u64)
        .map(|h| {
            let hc = HybridConfig::new(d, BUFFER, k).for_store::<CodedStore<Bitmask, Y>>();
            let mut cache = CodedHybridCache::<Bitmask, Y, f16>::new(hc).expect("config");
            let (keys, values) = common::keys_values(len, d, h, SEED);
            cache.extend(&keys, &values).expect("finite rows");
            cache
        })
        .collect();
    let bytes: usize = caches.iter().map(|c| c.memory().held_bytes()).sum();
    let mut out = vec![0.0; cfg.q_len()];
    common::time_step(c, format!("bitmask_{label}_d{d}_k{k}"), len, bytes, || {
        attn.coded_hybrid(&cfg, q, &caches, &mut out).expect("decode")
    });
}

/// A decoder that hides its layout, so the kernel decodes its rows a tile at a time: the
/// baseline the in-place reads are measured against.
struct Opaque<R>(R);

impl<R: DecodeRows> DecodeRows for Opaque<R> {
    fn head_dim(&self) -> usize {
        self.0.head_dim()
    }

    fn num_rows(&self) -> usize {
        self.0.num_rows()
    }

    fn decode_row(&self, j: usize, out: &mut [f32]) {
        self.0.decode_row(j, out);
    }
}

/// KIVI (`kivi`) or TurboQuant-style (`turbo`) rows behind a 128-row f16 buffer, read in
/// place and, beside them, through the row decoder (`…_decoded`).
fn coded<S: RowStore>(
    c: &mut Criterion,
    attn: &mut CpuAttention,
    (d, len): (usize, usize),
    q: &[f32],
    (label, group): (&str, usize),
    history: impl for<'h> Fn(&'h Hybrid<S, f16>) -> (Box<dyn DecodeRows + 'h>, Box<dyn DecodeRows + 'h>),
) {
    let cfg = common::layout(d);
    let hc = HybridConfig { rows_per_block: group, ..HybridConfig::lossless(d, BUFFER) };
    let caches: Vec<Hybrid<S, f16>> = (0..KV_HEADS as u64)
        .map(|h| {
            let mut cache = Hybrid::<S, f16>::new(hc).expect("config");
            let (keys, values) = common::keys_values(len, d, h, SEED);
            cache.extend(&keys, &values).expect("finite rows");
            cache
        })
        .collect();
    let bytes: usize = caches.iter().map(|c| c.memory().held_bytes()).sum();
    let mut out = vec![0.0; cfg.q_len()];
    let views: Vec<_> = caches.iter().map(|c| (history(c), c)).collect();
    let kv: Vec<_> = views
        .iter()
        .map(|((k, v), c)| {
            DecodedKv::new(&**k, &**v).with_buffer(c.buffer_keys(), c.buffer_values())
        })
        .collect();
    common::time_step(c, format!("{label}_d{d}"), len, bytes, || {
        attn.decoded(&cfg, q, &kv, &mut out).expect("decode")
    });
    let opaque: Vec<_> = views
        .iter()
        .map(|((k, v), c)| {
            DecodedKv::new(Opaque(&**k), Opaque(&**v))
                .with_buffer(c.buffer_keys(), c.buffer_values())
        })
        .collect();
    common::time_step(c, format!("{label}_decoded_d{d}"), len, bytes, || {
        attn.decoded(&cfg, q, &opaque, &mut out).expect("decode")
    });
}

fn formats(c: &mut Criterion) {
    let mut attn = common::attention();
    // Where bitmask rows are placed by AVX-512 VBMI2, the AVX2 placement runs beside it.
    let mut shuffled = matches!(attn.isa(), Isa::Avx512 | Isa::Avx2Vbmi2)
        .then(|| common::attention().with_isa(Isa::Avx2).expect("AVX2 under AVX-512"));
    let mut narrow = (attn.isa() == Isa::Avx512)
        .then(|| common::attention().with_isa(Isa::Avx2Vbmi2).expect("AVX2 under AVX-512"));
    let (dims, lens) = grid();
    for d in dims {
        let q = synth::values(Q_HEADS * d, 1);
        for &len in &lens {
            common::dense_f16(c, &mut attn, (d, len), &q, SEED, "");
            quant::<Int8Blocks>(c, &mut attn, (d, len), &q, "int8");
            quant::<Int4Blocks>(c, &mut attn, (d, len), &q, "int4");
            quant::<Fp8Rows>(c, &mut attn, (d, len), &q, "fp8");
            bitmask::<Elems<Fp8E4M3>>(c, &mut attn, (d, len), &q, "fp8");
            bitmask::<Int8Values>(c, &mut attn, (d, len), &q, "int8");
            bitmask::<Int4Values>(c, &mut attn, (d, len), &q, "int4");
            bitmask::<Elems<f16>>(c, &mut attn, (d, len), &q, "f16");
            coded::<KiviRows<2>>(c, &mut attn, (d, len), &q, ("kivi2", 32), |h| {
                let (k, v) = h.history();
                (Box::new(k), Box::new(v))
            });
            coded::<TurboRows<3>>(c, &mut attn, (d, len), &q, ("turbo3", 1), |h| {
                let (k, v) = h.history();
                (Box::new(k), Box::new(v))
            });
            if let Some(a) = &mut narrow {
                common::dense_f16(c, a, (d, len), &q, SEED, "_avx2");
                quant::<Int8Blocks>(c, a, (d, len), &q, "int8_avx2");
                bitmask::<Elems<Fp8E4M3>>(c, a, (d, len), &q, "fp8_avx2");
                bitmask::<Int8Values>(c, a, (d, len), &q, "int8_avx2");
            }
            if let Some(a) = &mut shuffled {
                bitmask::<Elems<Fp8E4M3>>(c, a, (d, len), &q, "fp8_pshufb");
                bitmask::<Int8Values>(c, a, (d, len), &q, "int8_pshufb");
            }
        }
    }
}

fn config() -> Criterion {
    common::config(10, Duration::from_millis(300), Duration::from_secs(1))
}

criterion_group! {
    name = benches;
    config = config();
    targets = formats
}
criterion_main!(benches);
