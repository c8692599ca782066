//! The frontier study's run: every configuration teacher-forced over the same windows, grouped
//! by the weights it shares, into measured points ([`FrontierPoint`], [`FrontierStudy`]).

use super::*;

/// One configuration's figures.
#[derive(Clone, Debug, Serialize)]
pub struct FrontierPoint {
    /// The configuration.
    pub run: FrontierRun,
    /// Its label.
    pub label: String,
    /// The spec it ran with (projection path elided).
    pub spec: String,
    /// Perplexity over the scored tokens of every window.
    pub perplexity: f64,
    /// Arg-max accuracy.
    pub top1: f64,
    /// Bytes held at the end of a window (mean over windows), all layers.
    pub window_bytes: f64,
    /// The same from the formulas (must be equal).
    pub window_formula_bytes: f64,
    /// `window_bytes` / dense f16 bytes of the same tokens.
    pub window_ratio: f64,
    /// Mean NLL of the scored positions of each window alone (the gaps' jackknife); empty for
    /// a reused point.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub window_nll: Vec<f64>,
    /// Bytes per token of a 4096-token cache / dense f16.
    pub long_ratio: f64,
    /// The same for the global layers alone (models with sliding-window layers only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub global_long_ratio: Option<f64>,
    /// Not dominated (fewer-or-equal bytes and lower-or-equal perplexity) at window bytes.
    pub frontier_window: bool,
    /// Not dominated at 4096-token bytes.
    pub frontier_long: bool,
    /// The `results.json` of an earlier run whose figures this point takes
    /// (`--frontier-reuse`); `None`: measured in this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_from: Option<String>,
}

/// llama.cpp's perplexity with a quantized KV cache on the same text.
#[derive(Clone, Debug, Default, Serialize)]
pub struct External {
    /// `ran` or why it did not.
    pub status: String,
    /// `(cache type, perplexity)` rows.
    pub rows: Vec<(String, f64)>,
    /// `(cache type, mean NLL of each window)` over the positions the tool scores (from its
    /// running perplexities, [`frontier_peer::chunk_nlls`]); a type whose output did not
    /// give one figure per window is absent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<(String, Vec<f64>)>,
}

/// Everything the study measured.
#[derive(Clone, Debug, Serialize)]
pub struct FrontierStudy {
    /// The model (its configuration's name) and its GGUF file name.
    pub model: String,
    /// The local (sliding-window) layers, whose rings every configuration keeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalLayers>,
    /// Evaluation play.
    pub eval_play: String,
    /// Windows × length, prefix prefilled (the rest scored through the decode path).
    pub windows: (usize, usize, usize),
    /// Head dimension.
    pub head_dim: usize,
    /// Every configuration.
    pub points: Vec<FrontierPoint>,
    /// Per-budget comparisons.
    pub budgets: Vec<BudgetRow>,
    /// Per-buffer, per-budget comparisons on equal footing.
    pub equal_footing: Vec<EqualFootingRow>,
    /// llama.cpp's own figures.
    pub external: External,
    /// Dense f16 perplexity over the positions llama.cpp's tool scores (the second half of
    /// each window but its first position).
    pub dense_f16_llamacpp_positions: Option<f64>,
    /// llama.cpp's own conditions for its KV types' counterparts (dense f16, Hadamard int8
    /// and int4): every position of each window through the cache (a one-token prompt fed
    /// through the decode path, as the tool's first position attends to its stored row), the
    /// perplexity over the positions llama.cpp's tool scores. Computed when the external
    /// check ran (empty without `--llama-cpp` or when the tool could not run).
    pub whole_window: Vec<(String, f64)>,
    /// The same configurations' mean NLL on each window alone (llama.cpp's positions), for
    /// the gaps' resolution ([`frontier_peer::peer_gap`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub whole_window_nll: Vec<(String, Vec<f64>)>,
    /// How the plan's SWAN grid was restricted ([`SwanGrid::describe`]), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restricted: Option<String>,
    /// The earlier runs whose SWAN figures were reused (`--frontier-reuse`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reused: Vec<ReuseSource>,
    /// The plan's SWAN configurations left out because no reused file measured them
    /// (`--frontier-reuse-only`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<String>,
}

impl FrontierStudy {
    pub(super) fn find(&self, label: &str) -> Option<&FrontierPoint> {
        self.points.iter().find(|p| p.label == label)
    }

    pub(super) fn dense_f16(&self) -> Option<&FrontierPoint> {
        self.find("dense f16")
    }

    /// The cost over dense f16 of configuration `label` with every position through the
    /// cache ([`FrontierStudy::whole_window`]).
    pub(super) fn whole_window_cost(&self, label: &str) -> Option<f64> {
        let ppl = |l: &str| self.whole_window.iter().find(|(x, _)| x == l).map(|r| r.1);
        Some(ppl(label)? / ppl("dense f16")? - 1.0)
    }

    /// llama.cpp KV type `ty` against its counterpart `label`, window by window (both under
    /// llama.cpp's condition), when both tools gave per-window figures.
    pub fn peer_gap(&self, ty: &str, label: &str) -> Option<PeerGap> {
        fn series<'a>(v: &'a [(String, Vec<f64>)], key: &str) -> Option<&'a [f64]> {
            v.iter().find(|(x, _)| x == key).map(|(_, w)| w.as_slice())
        }
        let (kv, kv16) =
            (series(&self.whole_window_nll, label)?, series(&self.whole_window_nll, "dense f16")?);
        let (lc, lc16) =
            (series(&self.external.windows, ty)?, series(&self.external.windows, "f16")?);
        frontier_peer::peer_gap(kv, kv16, lc, lc16)
    }
}

/// Runs every configuration of the plan's frontier grid on windows of `play`.
///
/// # Errors
/// Corpus, calibration, cache and forward errors.
pub fn run(
    ctx: &mut Context,
    llama_cpp: Option<&Path>,
    play: &str,
    reuse: &ReuseArgs,
    one_leg: bool,
) -> Result<FrontierStudy> {
    let proj = ctx.projection()?.display().to_string();
    let (count, wlen, prefix) = ctx.plan.frontier_eval;
    let mut windows = ctx.corpus.windows(play, 0, wlen, count)?;
    // As llama.cpp's perplexity tool: a model that starts its text with BOS starts every
    // window with it (in place of the window's first token).
    let specials = ctx.corpus.tokenizer().encode_with("", true)?;
    let plain = ctx.corpus.tokenizer().encode_with("", false)?;
    if let (Some(&bos), true) = (specials.first(), plain.is_empty())
        && windows.first().and_then(|w| w.first()) == Some(&bos)
    {
        for w in &mut windows {
            w[0] = bos;
        }
    }
    let bm = ByteModel::of(ctx.model.config());
    let d = bm.head_dim;
    let file = ctx.model_path().file_name().map_or(String::new(), |f| f.to_string_lossy().into());
    let model_name = format!("{} ({file})", ctx.model.config().name);
    let elided = |run: &FrontierRun| run.spec(&proj, 1).replace(&proj, "<calibrated.safetensors>");
    let mut reused = if reuse.files.is_empty() {
        Reused::none()
    } else {
        let key = LegKey { model: &model_name, play, windows: (count, wlen, prefix), head_dim: d };
        let r = Reused::load(reuse, key, one_leg)?;
        for why in r.skipped() {
            ctx.log(&format!("frontier: not reused for this leg: {why}"));
        }
        r
    };
    let mut runs: Vec<FrontierRun> = ctx.plan.frontier.clone();
    let mut not_run = Vec::new();
    if reuse.only {
        runs.retain(|r| {
            let keep = r.k.is_none() || reused.has(&elided(r), &r.label());
            if !keep {
                not_run.push(r.label());
            }
            keep
        });
        if !not_run.is_empty() {
            ctx.log(&format!(
                "frontier: {} SWAN configurations of the plan left out (no --frontier-reuse file \
                 measured them; --frontier-reuse-only)",
                not_run.len()
            ));
        }
    }
    // The SWAN configurations an earlier run measured take its figures; the rest run.
    let taken: Vec<Option<Measured>> = runs
        .iter()
        .map(|r| if r.k.is_some() { reused.take(&elided(r), &r.label()) } else { None })
        .collect();
    let todo: Vec<usize> = (0..runs.len()).filter(|&i| taken[i].is_none()).collect();
    if !reused.is_empty() {
        ctx.log(&format!(
            "frontier: {} configurations' figures reused, {} to run",
            runs.len() - todo.len(),
            todo.len()
        ));
    }
    let dense16_run = runs.iter().position(|r| *r == FrontierRun::dense(Code::F16, None));
    let mut caches: Vec<Vec<Box<dyn KvCache>>> = Vec::with_capacity(todo.len());
    let mut groups = group_by_weights(todo.iter().map(|&i| {
        let spec: CacheSpec = runs[i].spec(&proj, 1).parse()?;
        let (model, c) = spec.build_many(&ctx.model, windows.len())?;
        caches.push(c);
        Ok(model)
    }))?;
    // Dense f16's group first: reused figures are checked against it before the rest runs.
    groups.sort_by_key(|(_, members)| !members.iter().any(|&j| Some(todo[j]) == dense16_run));
    let mut traces: Vec<Vec<Trace>> = vec![Vec::new(); runs.len()];
    for (g, (model, members)) in groups.iter().enumerate() {
        let per_batch = (64 / members.len()).clamp(1, windows.len().max(1));
        for chunk in windows.chunks(per_batch) {
            let mut batch = Vec::new();
            let mut texts: Vec<(&[u32], &[u32])> = Vec::new();
            for &j in members {
                batch.extend(caches[j].drain(..chunk.len()));
                texts.extend(chunk.iter().map(|w| w.split_at(prefix)));
            }
            let t0 = std::time::Instant::now();
            let out = teacher_force_texts(
                model,
                &mut batch,
                &texts,
                PromptPath::Prefill,
                false,
                ctx.plan.threads,
            )?;
            ctx.log(&format!(
                "frontier: {} configurations × {} windows in {:.0} s",
                members.len(),
                chunk.len(),
                t0.elapsed().as_secs_f64()
            ));
            let mut out = out.into_iter();
            for &j in members {
                traces[todo[j]].extend(out.by_ref().take(chunk.len()));
            }
        }
        if g == 0
            && !reused.is_empty()
            && let Some(i) = dense16_run
        {
            reused.check_dense_f16(perplexity_from(&traces[i], 0))?;
        }
    }
    let tokens = wlen - 1;
    let dense16 = bm.dense_f16(tokens) as f64;
    // llama.cpp's perplexity tool predicts positions len/2 + 1 … len − 1 of each window;
    // kvtide scores prefix … len − 1. Dense f16 on llama.cpp's positions alone:
    let skip = (wlen / 2 + 1).saturating_sub(prefix);
    let on_llamacpp_tokens = runs
        .iter()
        .position(|r| *r == FrontierRun::dense(Code::F16, None))
        .map(|i| perplexity_from(&traces[i], skip));
    let mut points: Vec<FrontierPoint> = runs
        .iter()
        .zip(traces)
        .zip(taken)
        .map(|((run, ts), taken)| {
            let (mut nll, mut hits, mut n, mut bytes) = (0.0, 0usize, 0usize, 0.0);
            for t in &ts {
                nll += t.nll_sum();
                hits += t.hits();
                n += t.nll.len();
                bytes += t.at_end.total() as f64;
            }
            let (perplexity, top1, window_bytes, reused_from) = match taken {
                Some(m) => (m.perplexity, m.top1, m.window_bytes, Some(m.file)),
                None => (
                    (nll / n.max(1) as f64).exp(),
                    hits as f64 / n.max(1) as f64,
                    bytes / ts.len().max(1) as f64,
                    None,
                ),
            };
            let window_nll = ts.iter().map(|t| t.nll_sum() / t.nll.len().max(1) as f64).collect();
            let point = FrontierPoint {
                run: run.clone(),
                label: run.label(),
                spec: elided(run),
                perplexity,
                top1,
                window_bytes,
                window_formula_bytes: bm.bytes(run, tokens) as f64,
                window_ratio: window_bytes / dense16,
                window_nll,
                long_ratio: bm.ratio(run, LONG_CACHE),
                global_long_ratio: bm.global_ratio(run, LONG_CACHE),
                frontier_window: false,
                frontier_long: false,
                reused_from,
            };
            ctx.log(&format!(
                "frontier {}: ppl {:.3}, {:.3} × f16 (window), {:.3} × f16 (4096){}",
                point.label,
                point.perplexity,
                point.window_ratio,
                point.long_ratio,
                if point.reused_from.is_some() { " (reused)" } else { "" }
            ));
            point
        })
        .collect();
    mark_frontier(&mut points, |p| p.window_ratio, |p, f| p.frontier_window = f);
    mark_frontier(&mut points, |p| p.long_ratio, |p, f| p.frontier_long = f);
    let budgets = budget_rows(&points, bm.local.is_some());
    let equal_footing = equal_footing_rows(&points, bm.local.is_some());
    let text =
        models::load::text::read_text(&crate::paths::plays_dir().join(format!("{play}.md")))?;
    let external = external(ctx, llama_cpp, &text, (count, wlen));
    // Only worth its decode when there are peer rows to compare with.
    let (whole_window, whole_window_nll) = if !external.rows.is_empty() {
        whole_window(ctx, &windows, &runs, wlen / 2)?
    } else {
        (Vec::new(), Vec::new())
    };
    let dense_rows: Vec<(String, f64)> = points
        .iter()
        .filter(|p| p.run.k.is_none())
        .map(|p| (p.label.clone(), p.perplexity))
        .collect();
    Ok(FrontierStudy {
        model: model_name,
        local: bm.local,
        eval_play: play.to_owned(),
        windows: (count, wlen, prefix),
        head_dim: d,
        points,
        budgets,
        equal_footing,
        external,
        dense_f16_llamacpp_positions: on_llamacpp_tokens,
        whole_window,
        whole_window_nll,
        restricted: None,
        reused: reused.sources(&dense_rows),
        not_run,
    })
}
