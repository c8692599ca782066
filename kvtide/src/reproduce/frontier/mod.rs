//! The frontier study: perplexity against KV bytes for the formats a runtime already has —
//! dense f16, fp8 (per-token scale), int8 (`q8_0` blocks) and int4 (`q4_0` blocks), each
//! unrotated, Walsh–Hadamard-rotated (as llama.cpp rotates a quantized cache; in the full
//! grid also its value half alone, `hadamard-v`) or in the SWAN calibrated basis, and int8
//! keys with int4 values (and the reverse), as llama.cpp's `-ctk/-ctv` pair them — and SWAN
//! (`papers/swan.txt`, method section) under every row encoding (`u8` index list or bitmask
//! × f16 / fp8 / int8 / int4 values) × `k` × buffer `b`.
//!
//! Every byte a cache holds is counted (buffer, indices or masks, offsets, scales, block
//! headers), two ways: at the end of each evaluation window (short windows make the dense
//! buffer weigh more), and per token of a 4096-token cache from the formulas (checked against
//! the measured bytes: the [`formula_bytes`] check). The non-dominated points are marked,
//! a table per budget (0.15 … 0.5 × f16) gives the best dense and the best SWAN
//! configuration at or under it, and the external check runs llama.cpp's own perplexity
//! tool with `-ctk/-ctv f16, q8_0, q4_0` (and the mixed pairs `-ctk q8_0 -ctv q4_0`,
//! `-ctk q4_0 -ctv q8_0`) on the same text when its path is given; beside it, dense int4 in
//! seeded random orthogonal bases or sign-randomized Walsh–Hadamard bases
//! ([`add_rotation_draws`]) measures how far one rounding draw moves a 4-bit cost, the
//! resolution of a peer gap between two single draws, and whether the Hadamard matrix's
//! own sign pattern is a typical draw.
//!
//! The study runs once per model the project has set up ([`legs`]): the run's own model
//! (SmolLM2 by default) always, and Gemma 3 270M when `scripts/setup.sh gemma` fetched it —
//! a missing model is a printed skip, never a silent one. On a model with sliding-window
//! layers (Gemma 3) the caches serve the global layers and the local layers keep a dense
//! ring of their window — in a dense configuration's own format (a quantized one quantizes
//! every layer, as llama.cpp's `-ctk/-ctv` does), f16 for SWAN — and each SWAN
//! configuration with 8-bit values runs once more with `int8` rings ([`add_int8_rings`]),
//! and each int8 bitmask one with `int4` rings in Walsh–Hadamard coordinates
//! ([`add_int4_rings`]) and with `int8` key / `int4` value rings ([`add_mixed_rings`]);
//! the budgets count both (ring bytes included, dense f16 of the same windowed model as the
//! reference), and a third measure counts the global layers alone, the part a cache format
//! changes. Bitmask 8-bit SWAN configurations also run with query-weighted key selection
//! ([`add_query_selection`]) and integer-coded ones with components scaled by the basis'
//! eigenvalues ([`add_component_norm`]); a table sets each pair side by side.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use super::Context;
use super::decode::{PromptPath, Trace, group_by_weights, teacher_force_texts};
use super::findings::{Check, Finding};
use super::frontier_peer::{self, PeerGap};
use super::frontier_reuse::{LegKey, Measured, ReuseArgs, ReuseSource, Reused};
use super::plot::Plot;
use super::report::{Section, Table, num, pct};
use crate::error::{Result, invalid};
use models::cache::KvCache;
use models::cache::spec::CacheSpec;

/// Tokens of the cache the per-token budgets are quoted for.
pub const LONG_CACHE: usize = 4096;
/// The budgets (× dense f16 bytes) of the per-budget tables.
pub const BUDGETS: [f64; 6] = [0.15, 0.2, 0.25, 0.3, 0.4, 0.5];

/// The name of the Gemma 3 leg (suffix of its tables, figure and JSON record).
pub const GEMMA_LEG: &str = "gemma3";

/// One model the study runs on, or why it does not.
#[derive(Clone, Debug, PartialEq)]
pub struct Leg {
    /// `""` for the run's own model (its tables keep their plain names), else the suffix
    /// of this leg's table, figure and record names.
    pub tag: &'static str,
    /// The model, as the report names it.
    pub title: &'static str,
    /// The GGUF file, or the reason the leg is skipped.
    pub model: std::result::Result<PathBuf, String>,
}

impl Leg {
    /// `name` with this leg's suffix (`frontier_points` → `frontier_points_gemma3`).
    pub fn name(&self, name: &str) -> String {
        if self.tag.is_empty() { name.to_owned() } else { format!("{name}_{}", self.tag) }
    }

    /// The line printed (and written into the report) when the leg is skipped.
    pub fn skip_line(&self) -> Option<String> {
        self.model
            .as_ref()
            .err()
            .map(|why| format!("frontier: the {} leg is skipped: {why}", self.title))
    }
}

/// Which of the study's models a run covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegChoice {
    /// The run's model and every further model set up (the default).
    All,
    /// The further models alone (to rerun them without the run's model).
    FurtherOnly,
    /// The run's model alone: each further model's leg is a reported skip that names the flag.
    PrimaryOnly,
}

/// The models the study runs on: `primary` (the run's `--model`) always, then Gemma 3 from
/// `gemma` unless it is the primary model itself. A Gemma file that is absent gives a leg
/// whose `model` is the reason (fetch it with `scripts/setup.sh gemma`); `choice` drops the
/// primary leg ([`LegChoice::FurtherOnly`]) or turns the further ones into reported skips
/// ([`LegChoice::PrimaryOnly`]).
pub fn legs(primary: &Path, gemma: &Path, choice: LegChoice) -> Vec<Leg> {
    let mut out = Vec::new();
    let same = primary == gemma
        || (primary.file_name().is_some() && primary.file_name() == gemma.file_name());
    if choice != LegChoice::FurtherOnly || same {
        let title = if same { "Gemma 3 270M" } else { "the run's model" };
        out.push(Leg { tag: "", title, model: Ok(primary.to_path_buf()) });
    }
    if !same {
        let model = if choice == LegChoice::PrimaryOnly {
            Err("--primary-model-only was given".to_owned())
        } else if gemma.is_file() {
            Ok(gemma.to_path_buf())
        } else {
            Err(format!("{} not found (fetch it with scripts/setup.sh gemma)", gemma.display()))
        };
        out.push(Leg { tag: GEMMA_LEG, title: "Gemma 3 270M", model });
    }
    out
}

/// Tables and figures one leg's section holds.
pub fn expected(leg: &Leg) -> (Vec<String>, Vec<String>) {
    (
        ["frontier_points", "frontier_budgets", "frontier_external"]
            .iter()
            .map(|t| leg.name(t))
            .collect(),
        vec![leg.name("frontier_ppl_vs_bytes")],
    )
}

/// Local (sliding-window) layers of a model and the ring each keeps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LocalLayers {
    /// Local layers.
    pub layers: usize,
    /// Global layers (the ones the cache under study serves).
    pub global_layers: usize,
    /// Positions a local layer's ring holds.
    pub window: usize,
}

/// How bytes are counted on one model: `global_heads` (layer, kv-head) pairs served by the
/// cache under study plus, for a windowed model, the local layers' rings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ByteModel {
    /// Head dimension.
    pub head_dim: usize,
    /// KV heads per layer.
    pub kv_heads: usize,
    /// (layer, kv-head) pairs of the layers the cache under study serves.
    pub global_heads: usize,
    /// The local layers, if any.
    pub local: Option<LocalLayers>,
}

impl ByteModel {
    /// The byte model of `config`.
    pub fn of(config: &models::load::config::ModelConfig) -> Self {
        let local = config.local_attention.as_ref().map(|l| {
            let layers = l.local.iter().filter(|&&x| x).count();
            LocalLayers { layers, global_layers: l.local.len() - layers, window: l.window }
        });
        let global_layers = local.map_or(config.num_layers, |l| l.global_layers);
        Self {
            head_dim: config.head_dim,
            kv_heads: config.kv_heads,
            global_heads: global_layers * config.kv_heads,
            local,
        }
    }

    /// Bytes the local layers' rings of `run` hold after `tokens` positions (0 without
    /// local layers).
    pub fn ring_bytes(&self, run: &FrontierRun, tokens: usize) -> usize {
        self.local.map_or(0, |l| {
            let d = self.head_dim;
            // The sink rows stay in f32 in quantized rings too (a float ring keeps all).
            let quantized = matches!(run.ring_format(), Code::Fp8 | Code::Int8 | Code::Int4);
            let sink = if quantized { tokens.min(run.sink) } else { 0 };
            l.layers
                * self.kv_heads
                * (tokens.min(l.window) * run.ring_token_bytes(d) + sink * 2 * 4 * d)
        })
    }

    /// Bytes `run` holds for `tokens` positions, every layer counted.
    pub fn bytes(&self, run: &FrontierRun, tokens: usize) -> usize {
        self.global_heads * run.head_bytes(self.head_dim, tokens) + self.ring_bytes(run, tokens)
    }

    /// Bytes dense f16 holds for `tokens` positions on this model (local rings included).
    pub fn dense_f16(&self, tokens: usize) -> usize {
        self.bytes(&FrontierRun::dense(Code::F16, None), tokens)
    }

    /// `run`'s bytes over dense f16's, every layer counted.
    pub fn ratio(&self, run: &FrontierRun, tokens: usize) -> f64 {
        self.bytes(run, tokens) as f64 / self.dense_f16(tokens) as f64
    }

    /// The same over the global layers alone (`None` for a model without local layers).
    pub fn global_ratio(&self, run: &FrontierRun, tokens: usize) -> Option<f64> {
        self.local.map(|_| {
            run.head_bytes(self.head_dim, tokens) as f64 / (2 * tokens * 2 * self.head_dim) as f64
        })
    }
}

mod external;
mod findings;
mod plan;
mod report;
mod run;
#[cfg(test)]
mod tests;

use external::*;
pub use findings::*;
pub use plan::*;
pub use report::*;
pub use run::*;
