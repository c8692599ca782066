//! Resource limits of the parsers of outside bytes: a hostile file — one claiming
//! absurd counts, lengths, shapes or capacities — must not make a parser allocate more than
//! a bound proportional to the file's own size. Every parser is fed its valid seed files
//! (`fuzz/src/harness`) with every count-sized field overwritten by absurd values (and, for
//! the checksummed kv-sparse format, the checksums repaired so the claim reaches the
//! validation behind them); a counting allocator records the peak heap bytes the parse holds
//! on the parsing thread.
//!
//! The documented bound (`docs/bad-inputs.md`): peak heap during a parse ≤
//! [`BYTES_PER_INPUT_BYTE`] × input size + [`FIXED_BYTES`]. An accepted file's own decoded
//! data (e.g. f32 samples of 8-bit PCM) is inside that bound by construction.

#[allow(dead_code)]
#[path = "../../fuzz/src/harness/mod.rs"]
mod harness;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Heap bytes a parse may hold per input byte (the widest decode, 8-bit PCM to f32, is 4×;
/// the kv-sparse reader copies the image into an aligned buffer, 1×).
const BYTES_PER_INPUT_BYTE: usize = 8;
/// Heap bytes a parse may hold regardless of input size (tables, error strings, hound's
/// and serde_json's fixed buffers).
const FIXED_BYTES: usize = 256 * 1024;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static CURRENT: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The system allocator, counting the live bytes of the thread that turned tracking on.
struct Counting;

fn record(delta: isize) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = TRACKING.try_with(|on| {
        if on.get() {
            let now = CURRENT.get() + delta;
            CURRENT.set(now);
            PEAK.set(PEAK.get().max(now));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping only touches
// const-initialised thread-locals of plain integers, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size() as isize);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        record(-(layout.size() as isize));
        // SAFETY: `ptr` came from `System` with this layout (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size as isize - layout.size() as isize);
        // SAFETY: as `dealloc`; the caller guarantees `new_size` is valid for the layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak heap bytes `f` holds on this thread (above what was live when it started).
fn peak_heap(f: impl FnOnce()) -> usize {
    CURRENT.set(0);
    PEAK.set(0);
    TRACKING.set(true);
    f();
    TRACKING.set(false);
    PEAK.get().max(0) as usize
}

/// Asserts the documented bound for one input and returns its peak.
fn assert_bounded(what: &str, len: usize, peak: usize) -> usize {
    let bound = BYTES_PER_INPUT_BYTE * len + FIXED_BYTES;
    assert!(
        peak <= bound,
        "{what}: a {len}-byte input made the parser hold {peak} B (bound {bound} B)"
    );
    peak
}

/// Values a hostile count field takes.
const ABSURD: [u64; 7] =
    [u64::MAX, i64::MAX as u64, 1 << 40, 1 << 32, u32::MAX as u64, 0x7fff_ffff, 1 << 24];

/// `seed` with the little-endian word of `width` bytes at `at` set to `value`.
fn with_word(seed: &[u8], at: usize, width: usize, value: u64) -> Vec<u8> {
    let mut v = seed.to_vec();
    let end = (at + width).min(v.len());
    v[at..end].copy_from_slice(&value.to_le_bytes()[..end - at]);
    v
}

/// Every mutant of `seed` with one 4- or 8-byte word in its first `span` bytes (every byte
/// offset) set to an [`ABSURD`] value.
fn absurd_words(seed: &[u8], span: usize) -> impl Iterator<Item = Vec<u8>> + '_ {
    let span = span.min(seed.len());
    (0..span).flat_map(move |at| {
        [4usize, 8]
            .into_iter()
            .flat_map(move |w| ABSURD.iter().map(move |&v| with_word(seed, at, w, v)))
    })
}

/// Runs every hostile mutant of every seed through `parse`, checking the bound; returns
/// (inputs, worst peak per input byte).
fn sweep(name: &str, seeds: &[Vec<u8>], span: usize, parse: impl Fn(&[u8])) -> (usize, f64) {
    let (mut n, mut worst) = (0usize, 0f64);
    for seed in seeds {
        for input in absurd_words(seed, span) {
            let peak = assert_bounded(name, input.len(), peak_heap(|| parse(&input)));
            worst = worst.max(peak as f64 / input.len() as f64);
            n += 1;
        }
    }
    eprintln!("{name}: {n} hostile inputs, worst peak {worst:.2} B per input byte");
    (n, worst)
}

#[test]
fn kv_sparse_cache_files() {
    let parse = |data: &[u8]| {
        let _ = kv_sparse::persist::MappedCache::from_bytes(data);
        // The checksummed variant: the claim reaches the directory and CSR validation.
        if let Some(fixed) = harness::persist::with_valid_checksums(data) {
            let _ = kv_sparse::persist::MappedCache::from_bytes(&fixed);
        }
    };
    // Header (128 B) and the first head entries of the directory.
    let (n, _) = sweep("kv-sparse", &harness::persist::seeds(), 128 + 160, parse);
    assert!(n > 10_000);
}

#[test]
fn gguf_files() {
    // `from_bytes` takes ownership of the image: its copy counts against the bound (1×).
    let parse = |data: &[u8]| {
        let _ = models::load::gguf::GgufFile::from_bytes(data.to_vec());
    };
    let seeds = harness::gguf::seeds();
    // Header, metadata counts/lengths/array sizes and the tensor infos of the small seeds.
    let (n, _) = sweep("gguf", &seeds[1..], 512, parse);
    assert!(n > 10_000);
}

#[test]
fn wav_files() {
    let parse = |data: &[u8]| {
        let _ = models::audio::read_wav_from(std::io::Cursor::new(data));
    };
    // RIFF/fmt/data headers: chunk sizes, channels, rates, block align, bits.
    let (n, _) = sweep("wav", &harness::wav::seeds(), 64, parse);
    assert!(n > 3_000);
}

/// A safetensors image: `header` framed with its length, then `body`.
fn safetensors(header: &str, body: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn projection_files() {
    let parse = |data: &[u8]| {
        let _ = projection::ProjectionSet::from_bytes(data);
    };
    // The 8-byte header length claiming absurd sizes, then JSON headers claiming absurd
    // shapes and offsets.
    let seeds = harness::projection::seeds();
    let (n, _) = sweep("projection", &seeds, 8, parse);
    assert!(n > 50);
    let huge = [u64::MAX, 1 << 40, u64::from(u32::MAX), 1 << 31];
    let mut hostile = Vec::new();
    for &x in &huge {
        for shape in [format!("[{x}]"), format!("[{x},{x}]"), format!("[1,{x},64,64]")] {
            let h = format!(
                r#"{{"__metadata__":{{"format":"kvtide-projection"}},"p_qk":{{"dtype":"F32","shape":{shape},"data_offsets":[0,{x}]}}}}"#
            );
            hostile.push(safetensors(&h, &[0u8; 64]));
        }
    }
    for seed in &seeds {
        for at in 0..48 {
            for choice in 0..22 {
                hostile.extend(harness::projection::header_mutant(seed, at, choice, false));
            }
        }
    }
    for input in &hostile {
        assert_bounded("projection", input.len(), peak_heap(|| parse(input)));
    }
}

#[test]
fn config_files() {
    // What a loader does with a config.json: the decoder config, then the audio encoder's.
    let parse = |data: &[u8]| {
        let text = std::str::from_utf8(data).expect("mutants are JSON text");
        let _ = models::ModelConfig::from_hf_json(text);
        if let Ok(json) = serde_json::from_str::<serde_json::Value>(text) {
            let audio = json.get("audio_config").unwrap_or(&json);
            let _ = models::audio::VoxtralAudioConfig::from_json(audio);
            let _ = models::audio::OmniAudioConfig::from_json(audio);
        }
    };
    let mut hostile = Vec::new();
    for seed in harness::config::seeds() {
        for at in 0..64 {
            for choice in 0..22 {
                hostile.extend(harness::config::json_mutant(&seed, at, choice, false));
            }
        }
    }
    for input in &hostile {
        assert_bounded("config", input.len(), peak_heap(|| parse(input)));
    }
    assert!(hostile.len() > 5_000);
}
