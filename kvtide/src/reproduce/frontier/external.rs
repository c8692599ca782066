//! The frontier study's external peer: llama.cpp's perplexity tool on the same text and
//! windows (`-ctk/-ctv` pairs), and the per-window NLLs it is compared by.

use super::*;

/// Runs llama.cpp's perplexity tool (in `dir`) on `text` with each KV cache type.
pub(super) fn external(
    ctx: &Context,
    dir: Option<&Path>,
    text: &str,
    windows: (usize, usize),
) -> External {
    let Some(dir) = dir else {
        let status = "skipped: no --llama-cpp DIR given (build the tools with ../shared/recipes/llamacpp-peer.sh)";
        ctx.log(&format!("frontier external check {status}"));
        return External { status: status.into(), ..External::default() };
    };
    match run_external(ctx, dir, text, windows) {
        Ok((rows, windows)) => External { status: "ran".into(), rows, windows },
        Err(e) => {
            let status = format!("skipped: {e}");
            ctx.log(&format!("frontier external check {status}"));
            External { status, ..External::default() }
        }
    }
}

pub(super) fn run_external(
    ctx: &Context,
    dir: &Path,
    text: &str,
    (count, len): (usize, usize),
) -> Result<ExternalRows> {
    let tool = |name: &str| {
        let p = dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(invalid("llama.cpp", format!("{} missing", p.display())))
        }
    };
    let (perplexity, quantize) = (tool("llama-perplexity")?, tool("llama-quantize")?);
    let model = ctx.model_path();
    let f32_gguf: PathBuf = crate::paths::cache_dir().join("models").join(format!(
        "{}-F32.gguf",
        model.file_stem().and_then(|s| s.to_str()).unwrap_or("model")
    ));
    requantize_f32(&quantize, model, &f32_gguf)?;
    let eval_text = eval_text_file(text)?;
    let threads = ctx.plan.threads.to_string();
    let (mut rows, mut per_window) = (Vec::new(), Vec::new());
    for (ty, ctk, ctv) in LLAMACPP_TYPES {
        let out = Command::new(&perplexity)
            .arg("-m")
            .arg(&f32_gguf)
            .arg("-f")
            .arg(eval_text.path())
            .args(["-c", &len.to_string(), "--chunks", &count.to_string(), "-t", &threads])
            .args(["-fa", "on", "-ctk", ctk, "-ctv", ctv])
            .output()
            .map_err(|e| invalid("llama-perplexity", e.to_string()))?;
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ppl = all
            .lines()
            .find_map(|l| l.split("Final estimate: PPL = ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|x| x.parse::<f64>().ok())
            .ok_or_else(|| {
                invalid("llama-perplexity", format!("no final estimate for -ctk {ty}"))
            })?;
        ctx.log(&format!("frontier external: llama.cpp -ctk/-ctv {ty}: ppl {ppl:.4}"));
        rows.push((ty.to_owned(), ppl));
        let nll = frontier_peer::chunk_nlls(&all);
        if nll.len() == count {
            per_window.push((ty.to_owned(), nll));
        } else {
            ctx.log(&format!(
                "frontier external: llama.cpp -ctk/-ctv {ty}: {} per-chunk figures for {count} windows; its gaps' resolution is not computed",
                nll.len()
            ));
        }
    }
    Ok((rows, per_window))
}

/// Makes `dest`, the F32 copy of `model` llama.cpp's tools score, unless it is already there.
///
/// The tool writes a file of its own (named after this process) that is renamed onto `dest`
/// only once it succeeded, so an interrupted or failed conversion never leaves a truncated
/// GGUF where a later run would take it for finished, and two runs converting the same model
/// at once each rename a whole file.
pub(super) fn requantize_f32(quantize: &Path, model: &Path, dest: &Path) -> Result<()> {
    if dest.is_file() {
        return Ok(());
    }
    let mut partial = dest.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let out = Command::new(quantize)
        .arg("--allow-requantize")
        .args([model.as_os_str(), partial.as_os_str()])
        .arg("F32")
        .output();
    let done = match out {
        Err(e) => Err(invalid("llama-quantize", e.to_string())),
        Ok(out) if !out.status.success() => {
            Err(invalid("llama-quantize", String::from_utf8_lossy(&out.stderr).into_owned()))
        }
        Ok(_) if !partial.is_file() => Err(invalid(
            "llama-quantize",
            format!("reported success but wrote no {}", partial.display()),
        )),
        Ok(_) => std::fs::rename(&partial, dest)
            .map_err(|e| invalid("llama-quantize", format!("{}: {e}", dest.display()))),
    };
    if done.is_err() {
        // A failed conversion's own output is not kept; it may be missing already.
        let _ = std::fs::remove_file(&partial);
    }
    done
}

/// The scored text in a file of its own for llama.cpp's `-f` (removed when dropped), so runs
/// side by side on other texts never read each other's.
pub(super) fn eval_text_file(text: &str) -> Result<tempfile::NamedTempFile> {
    let mut file = tempfile::Builder::new()
        .prefix("kvtide-frontier-eval-")
        .suffix(".txt")
        .tempfile()
        .map_err(|e| invalid("frontier text", e.to_string()))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .and_then(|()| std::io::Write::flush(&mut file))
        .map_err(|e| invalid("frontier text", e.to_string()))?;
    Ok(file)
}

/// llama.cpp's KV types the external check runs: `(row name, -ctk, -ctv)`. Keys and values
/// share a type in the first three; `q8_0/q4_0` and `q4_0/q8_0` are the mixed pairs.
pub(super) const LLAMACPP_TYPES: [(&str, &str, &str); 5] = [
    ("f16", "f16", "f16"),
    ("q8_0", "q8_0", "q8_0"),
    ("q4_0", "q4_0", "q4_0"),
    ("q8_0/q4_0", "q8_0", "q4_0"),
    ("q4_0/q8_0", "q4_0", "q8_0"),
];

/// llama.cpp's perplexity per KV type, and its mean NLL per window where the tool's output
/// gave one per window.
pub(super) type ExternalRows = (Vec<(String, f64)>, Vec<(String, Vec<f64>)>);

/// A trace's NLLs from index `skip` on (with `skip` from [`run`]: the positions llama.cpp's
/// tool scores).
pub(super) fn scored(t: &Trace, skip: usize) -> &[f64] {
    t.nll.get(skip..).unwrap_or(&[])
}

/// Mean NLL of each trace over its scored tokens from index `skip` on.
pub(super) fn window_nlls(traces: &[Trace], skip: usize) -> Vec<f64> {
    traces
        .iter()
        .map(|t| {
            let kept = scored(t, skip);
            kept.iter().sum::<f64>() / kept.len().max(1) as f64
        })
        .collect()
}

/// Perplexity over each trace's scored tokens from index `skip` on (the positions
/// llama.cpp's tool scores).
pub(super) fn perplexity_from(traces: &[Trace], skip: usize) -> f64 {
    let (sum, n) = traces.iter().fold((0.0, 0usize), |(s, n), t| {
        let kept = scored(t, skip);
        (s + kept.iter().sum::<f64>(), n + kept.len())
    });
    (sum / n.max(1) as f64).exp()
}

/// The study's counterparts of llama.cpp's KV types, in the grid's labels (the first of a
/// type is the one its target judges; `q8_0`'s second is the same cache scored with int8
/// queries, as llama.cpp scores it, where the CPU has the integer products; `q4_0`'s second
/// rotates the values alone, the full grid's `hadamard-v`, its third rounds the queries to
/// `q8_0` blocks as llama.cpp's CPU flash attention does; the `sink=1` ones keep the first
/// position in f32, which llama.cpp does not — reported beside, not judged; the mixed pairs
/// have no target and are reported as measured).
pub(super) const LLAMACPP_COUNTERPARTS: [(&str, &str); 11] = [
    ("f16", "dense f16"),
    ("q8_0", "dense int8 rotate=hadamard"),
    ("q4_0", "dense int4 rotate=hadamard"),
    ("q8_0", "dense int8 rotate=hadamard queries=int8"),
    ("q4_0", "dense int4 rotate=hadamard-v"),
    ("q4_0", "dense int4 rotate=hadamard queries=q8_0"),
    ("q8_0", "dense int8 rotate=hadamard sink=1"),
    ("q4_0", "dense int4 rotate=hadamard sink=1"),
    ("q8_0/q4_0", "dense int8 values=int4 rotate=hadamard"),
    ("q8_0/q4_0", "dense int8 values=int4 rotate=hadamard sink=1"),
    ("q4_0/q8_0", "dense int4 values=int8 rotate=hadamard"),
];

/// The counterparts of llama.cpp's KV types under llama.cpp's conditions: the tool runs each
/// whole window through its quantized cache, so the first half's hidden states (and the K/V
/// the scored half attends to) carry the quantization error, where the grid prefills the
/// first half exactly. Here every position goes through the decode path — the first (BOS)
/// too, attending to its own stored row as the tool's first position does, so a quantized
/// value's rounding reaches the attention sink's hidden states in every later layer — and the
/// perplexity counts positions `skip + 1 …` of each window (those the tool scores).
pub(super) fn whole_window(
    ctx: &Context,
    windows: &[Vec<u32>],
    runs: &[FrontierRun],
    skip: usize,
) -> Result<WholeWindow> {
    let chosen: Vec<&FrontierRun> = LLAMACPP_COUNTERPARTS
        .iter()
        .filter_map(|(_, label)| runs.iter().find(|r| r.label() == *label))
        .chain(runs.iter().filter(|r| r.is_rotation_draw()))
        .collect();
    let mut caches: Vec<Vec<Box<dyn KvCache>>> = Vec::new();
    let groups = group_by_weights(chosen.iter().map(|run| {
        let spec: CacheSpec = run.spec("", 1).parse()?;
        let (model, c) = spec.build_many(&ctx.model, windows.len())?;
        caches.push(c);
        Ok(model)
    }))?;
    let texts: Vec<(&[u32], &[u32])> = windows.iter().map(|w| w.split_at(1)).collect();
    let mut out = vec![(String::new(), f64::NAN); chosen.len()];
    let mut nll = vec![(String::new(), Vec::new()); chosen.len()];
    for (model, members) in &groups {
        let t0 = std::time::Instant::now();
        let mut batch = Vec::new();
        let mut all_texts = Vec::new();
        for &i in members {
            batch.append(&mut caches[i]);
            all_texts.extend_from_slice(&texts);
        }
        let traces = teacher_force_texts(
            model,
            &mut batch,
            &all_texts,
            PromptPath::Decode,
            false,
            ctx.plan.threads,
        )?;
        for (&i, ts) in members.iter().zip(traces.chunks(windows.len())) {
            let ppl = perplexity_from(ts, skip);
            ctx.log(&format!(
                "frontier whole-window {}: ppl {ppl:.4} on llama.cpp's positions",
                chosen[i].label()
            ));
            out[i] = (chosen[i].label(), ppl);
            nll[i] = (chosen[i].label(), window_nlls(ts, skip));
        }
        ctx.log(&format!(
            "frontier whole-window: {} configurations × {} windows in {:.0} s",
            members.len(),
            windows.len(),
            t0.elapsed().as_secs_f64()
        ));
    }
    Ok((out, nll))
}

/// The counterparts' perplexities under llama.cpp's condition, and their mean NLL per window.
pub(super) type WholeWindow = (Vec<(String, f64)>, Vec<(String, Vec<f64>)>);
