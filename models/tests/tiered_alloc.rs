//! The `swan+tiered` cache's decode step (WnW §2.3 over SWAN sparse fp8 rows: append,
//! attention over the resident dense and sparse rows in place, anchor feedback, chunk swap)
//! makes no heap allocation once warmed up, on any thread. Driven through the `KvCache`
//! interface with synthetic K/V, so that no model forward shares the counter.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use models::cache::spec::{CacheKind, CacheSpec};
use models::cache::{CacheShape, KvCache, LayerKv, StepQkv};
use projection::{ModelDims, ProjectionSet};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Deterministic values in `[-1, 1)` written into `out` (no allocation).
fn fill(out: &mut [f32], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for v in out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
    }
}

/// Both compact row kinds in one test (the allocation counter is process-wide).
#[test]
fn swan_and_turbo_tiered_decode_steps_do_not_allocate() {
    let shape = CacheShape::new(2, attn_kernels::AttnConfig::new(4, 2, 16).unwrap());
    let dims =
        ModelDims::new(shape.layers, shape.q_heads(), shape.kv_heads(), shape.head_dim()).unwrap();
    let set = Arc::new(ProjectionSet::random(dims, "toy", 3).unwrap());
    let tail = "span=4..84,segment=4,chunk=8,r_gpu=0.5,n_voice=3,n_anchor=1,top=2,threads=2";
    let spec: CacheSpec = format!("swan+tiered:k=8,kv=6,basis=random:3,{tail}").parse().unwrap();
    let CacheKind::SwanTiered(swan, tiered) = &spec.kind else { unreachable!() };
    let swan = Some((swan.config(shape.head_dim()), set.clone()));
    steady_state(shape, tiered.build(shape, swan, 2).unwrap());
    let spec: CacheSpec = format!("turbo+tiered:bits=3,qjl=on,{tail}").parse().unwrap();
    let CacheKind::CodedTiered(coded, tiered) = &spec.kind else { unreachable!() };
    steady_state(shape, tiered.build_rows(shape, coded.span_rows(), Some(set), 2).unwrap());
}

/// Prefills `cache` and checks that its steady-state decode steps allocate nothing while
/// recalls happen.
fn steady_state(shape: CacheShape, mut cache: Box<dyn KvCache>) {
    let (prompt, steps, warm) = (96, 300, 100);
    cache.reserve(prompt + steps + 1).unwrap();

    let request = cache.attention_request(prompt).expect("WnW asks for span attention");
    let n = shape.kv_heads() * prompt * shape.head_dim();
    let (mut keys, mut values) = (vec![0.0; n], vec![0.0; n]);
    let mut received = vec![0.0; shape.q_heads() * request.keys.len()];
    for layer in 0..shape.layers {
        fill(&mut received, 10 + layer as u64);
        received.iter_mut().for_each(|x| *x = x.abs());
        cache.prefill_attention(layer, &received).unwrap();
        fill(&mut keys, 20 + layer as u64);
        fill(&mut values, 30 + layer as u64);
        cache.prefill(layer, LayerKv { keys: &keys, values: &values, tokens: prompt }).unwrap();
    }

    let (qn, kn) = (shape.q_heads() * shape.head_dim(), shape.kv_heads() * shape.head_dim());
    let (mut q, mut k, mut v, mut out) =
        (vec![0.0; qn], vec![0.0; kn], vec![0.0; kn], vec![0.0; qn]);
    let mut step = |cache: &mut Box<dyn KvCache>, s: usize| {
        for layer in 0..shape.layers {
            let seed = (s * shape.layers + layer) as u64;
            fill(&mut q, 3 * seed + 1000);
            // Sharpen the queries so that the anchor heads' focus moves over the span.
            q.iter_mut().for_each(|x| *x *= 4.0);
            fill(&mut k, 3 * seed + 1001);
            fill(&mut v, 3 * seed + 1002);
            cache.decode(layer, StepQkv { q: &q, k: &k, v: &v }, &mut out).unwrap();
        }
        cache.end_step().unwrap();
    };
    for s in 0..warm {
        step(&mut cache, s);
    }
    // Let the recall worker run dry and block once (crossbeam's one-time per-thread
    // allocation on the first blocking receive, see kv-tiered's tests/alloc_free.rs).
    std::thread::sleep(std::time::Duration::from_millis(50));
    let recalls = |c: &dyn KvCache| c.stats().into_iter().find(|s| s.0 == "recalls").unwrap().1;
    let recalls_before = recalls(cache.as_ref());
    let before = ALLOCS.load(Ordering::Relaxed);
    for s in warm..steps {
        step(&mut cache, s);
    }
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert!(recalls(cache.as_ref()) > recalls_before, "recalls happened in the measured steps");
    assert_eq!(allocs, 0, "allocations during {} steady-state steps", steps - warm);
}
