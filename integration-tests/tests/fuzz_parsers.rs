//! In-tree property fuzzing of every parser of outside bytes: each parser gets
//! ≥ 10 000 arbitrary byte strings and ≥ 10 000 mutated valid files per run, and must give a
//! typed error or a valid value — never a panic. The oracles and seed files are the ones
//! the libFuzzer targets use (`fuzz/src/harness`, included here by path), so CI runs the
//! same checks the long fuzzing runs did. Inputs stay small (≤ 4 KiB arbitrary; seeds of a
//! few KiB) so the whole file runs in seconds on 2 cores.
//!
//! `FUZZ_CASES` overrides the per-test case count (e.g. `FUZZ_CASES=200000` for a longer
//! local run). Failures are persisted by proptest in `fuzz_parsers.proptest-regressions`
//! next to this file and replayed first on every run (the ones there were found here and
//! fixed: kv-sparse buffer capacity and scale overflow, projection sample weights, WAV).

#[allow(dead_code)]
#[path = "../../fuzz/src/harness/mod.rs"]
mod harness;

use std::sync::OnceLock;

use harness::mutate::{INTERESTING, Mutation, mutated};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Cases per property: at least 10 000.
fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000).max(1)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let word = prop_oneof![
        (0..INTERESTING.len()).prop_map(|i| INTERESTING[i]),
        any::<u64>(),
        (0u64..4096),
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, value)| Mutation::SetByte { at, value }),
        (any::<usize>(), 0u8..4, word).prop_map(|(at, width, value)| Mutation::SetWord {
            at,
            width,
            value
        }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (any::<usize>(), 1usize..256).prop_map(|(at, len)| Mutation::Remove { at, len }),
        (any::<usize>(), any::<usize>(), 1usize..256)
            .prop_map(|(from, to, len)| Mutation::CopyWithin { from, to, len }),
    ]
}

/// A valid seed (index into `seeds`) and 1–5 mutations of it.
fn mutated_seed(seeds: &'static [Vec<u8>]) -> impl Strategy<Value = Vec<u8>> {
    (0..seeds.len(), prop::collection::vec(mutation(), 1..6))
        .prop_map(move |(i, edits)| mutated(&seeds[i], &edits))
}

fn arbitrary_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..4096)
}

fn persist_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(harness::persist::seeds)
}

fn projection_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(harness::projection::seeds)
}

fn wav_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(harness::wav::seeds)
}

fn gguf_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(harness::gguf::seeds)
}

fn config_seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(harness::config::seeds)
}

/// Every target: name, oracle and seeds.
type Target = (&'static str, fn(&[u8]), fn() -> &'static [Vec<u8>]);

const TARGETS: [Target; 5] = [
    ("persist", harness::persist::check, persist_seeds),
    ("projection", harness::projection::check, projection_seeds),
    ("wav", harness::wav::check, wav_seeds),
    ("gguf", harness::gguf::check, gguf_seeds),
    ("config", harness::config::check, config_seeds),
];

#[test]
fn seeds_are_accepted() {
    for (i, seed) in persist_seeds().iter().enumerate() {
        kv_sparse::persist::MappedCache::from_bytes(seed)
            .unwrap_or_else(|e| panic!("persist seed {i}: {e}"));
    }
    for (i, seed) in projection_seeds().iter().enumerate() {
        projection::ProjectionSet::from_bytes(seed)
            .unwrap_or_else(|e| panic!("projection seed {i}: {e}"));
    }
    for (i, seed) in wav_seeds().iter().enumerate() {
        models::audio::read_wav_from(std::io::Cursor::new(seed))
            .unwrap_or_else(|e| panic!("wav seed {i}: {e}"));
    }
    for (i, seed) in gguf_seeds().iter().enumerate() {
        models::load::gguf::GgufFile::from_bytes(seed.clone())
            .unwrap_or_else(|e| panic!("gguf seed {i}: {e}"));
    }
    let gguf = models::load::gguf::GgufFile::from_bytes(gguf_seeds()[0].clone()).unwrap();
    models::load::gguf::config_from_gguf(&gguf).expect("toy llama config");
    models::Tokenizer::from_gguf(&gguf).expect("toy tokenizer");
    for (i, seed) in config_seeds().iter().enumerate() {
        let text = std::str::from_utf8(seed).unwrap();
        let json: serde_json::Value = serde_json::from_str(text).unwrap();
        let parsed = match json.get("audio_config") {
            None => models::ModelConfig::from_hf_json(text).map(drop),
            Some(a) if json["model_type"] == "voxtral" => {
                models::audio::VoxtralAudioConfig::from_json(a).map(drop)
            }
            Some(a) => models::audio::OmniAudioConfig::from_json(a).map(drop),
        };
        parsed.unwrap_or_else(|e| panic!("config seed {i}: {e}"));
    }
    for (name, check, seeds) in TARGETS {
        for seed in seeds() {
            eprintln!("{name}: checking a {}-byte seed", seed.len());
            check(seed);
        }
    }
}

/// The directory of the libFuzzer project (`fuzz/`).
fn fuzz_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Every file under `fuzz/<dir>/<target>/`, in name order (none if the directory is absent).
fn files(dir: &str, target: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .map(|e| e.expect("directory entry").path())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("read corpus file");
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

/// Inputs the long fuzzing runs found crashing (committed under `fuzz/regressions/`) and
/// the committed seed corpora stay fixed: each goes through its target's oracle again.
#[test]
fn committed_fuzz_inputs_replay() {
    for (target, check, _) in TARGETS {
        for dir in ["regressions", "seeds"] {
            for (path, bytes) in files(dir, target) {
                eprintln!("replaying {}", path.display());
                check(&bytes);
            }
        }
    }
}

/// The mmap path sees the same bytes as `from_bytes`: each persist seed, written to a file,
/// opens through `MappedCache::open` with identical results.
#[test]
fn persist_seeds_open_through_mmap() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (i, seed) in persist_seeds().iter().enumerate() {
        let path = dir.path().join(format!("seed-{i}.kvs"));
        std::fs::write(&path, seed).expect("write seed");
        // SAFETY: the file lives in a private temp dir nothing else writes or truncates.
        let mapped = unsafe { kv_sparse::persist::MappedCache::open(&path) }.expect("open");
        assert_eq!(mapped.file_bytes(), seed.len());
        let read = kv_sparse::persist::MappedCache::read(&path).expect("read");
        assert_eq!(format!("{mapped:?}"), format!("{read:?}"));
    }
}

/// Writes the seed corpora `fuzz/seeds/<target>/` (run by `fuzz/gen-seeds.sh`).
#[test]
#[ignore = "writes fuzz/seeds; run by fuzz/gen-seeds.sh"]
fn write_fuzz_seed_corpora() {
    for (target, _, seeds) in TARGETS {
        let dir = fuzz_dir().join("seeds").join(target);
        std::fs::create_dir_all(&dir).expect("create seed dir");
        for (i, seed) in seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i:02}")), seed).expect("write seed");
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn persist_arbitrary_bytes(data in arbitrary_bytes()) {
        harness::persist::check(&data);
    }

    #[test]
    fn persist_mutated_files(data in mutated_seed(persist_seeds())) {
        harness::persist::check(&data);
    }

    #[test]
    fn projection_arbitrary_bytes(data in arbitrary_bytes()) {
        harness::projection::check(&data);
    }

    #[test]
    fn projection_mutated_files(data in mutated_seed(projection_seeds())) {
        harness::projection::check(&data);
    }

    #[test]
    fn projection_mutated_headers(
        i in 0..6usize,
        at in 0u64..200,
        choice in any::<u64>(),
        remove in any::<bool>(),
    ) {
        let seed = &projection_seeds()[i % projection_seeds().len()];
        let data = harness::projection::header_mutant(seed, at, choice, remove);
        harness::projection::check(&data.expect("seeds are safetensors images"));
    }

    #[test]
    fn wav_arbitrary_bytes(data in arbitrary_bytes()) {
        harness::wav::check(&data);
    }

    #[test]
    fn wav_mutated_files(data in mutated_seed(wav_seeds())) {
        harness::wav::check(&data);
    }

    #[test]
    fn gguf_arbitrary_bytes(data in arbitrary_bytes()) {
        harness::gguf::check(&data);
    }

    #[test]
    fn gguf_mutated_files(data in mutated_seed(gguf_seeds())) {
        harness::gguf::check(&data);
    }

    #[test]
    fn config_arbitrary_text(data in "\\PC{0,512}") {
        harness::config::check(data.as_bytes());
    }

    #[test]
    fn config_mutated_files(data in mutated_seed(config_seeds())) {
        harness::config::check(&data);
    }

    #[test]
    fn config_mutated_json(
        i in 0..8usize,
        at in 0u64..120,
        choice in any::<u64>(),
        remove in any::<bool>(),
    ) {
        let seed = &config_seeds()[i % config_seeds().len()];
        let data = harness::config::json_mutant(seed, at, choice, remove);
        harness::config::check(&data.expect("seeds are JSON"));
    }
}
