//! The resolution of the frontier study's peer comparison (the external check of
//! [`super::frontier`]): per-window figures from llama.cpp's perplexity tool and from
//! kvtide's counterparts of its KV types under the same condition, and each cost gap's
//! standard error over the windows.
//!
//! A gap between kvtide's cost over dense f16 and llama.cpp's (e.g. `dense int4
//! rotate=hadamard` against `q4_0`) is a difference of two ratios, each an average over a
//! handful of windows. How far it would move on other windows of the same text is what
//! decides whether a gap of a few percentage points says anything: the leave-one-window-out
//! jackknife gives that standard error from the per-window mean negative log-likelihoods
//! both tools score on the same positions. Nothing here changes a figure; it says how
//! precisely each one is known.

/// Per-chunk mean negative log-likelihood from the output of llama.cpp's perplexity tool.
///
/// The tool prints `[i]P_i,` after chunk `i`, `P_i` being the perplexity over chunks `1 … i`
/// (the same number of scored positions in each), so chunk `i`'s mean NLL is
/// `i·ln P_i − (i−1)·ln P_{i−1}`. Reads the first unbroken run `[1] … [n]` of positive
/// numbers; returns an empty vector when there is none, or when a value inside the run does
/// not parse as one.
pub fn chunk_nlls(output: &str) -> Vec<f64> {
    let mut running = Vec::new();
    let mut rest = output;
    while let Some(open) = rest.find('[') {
        rest = &rest[open + 1..];
        let Some(close) = rest.find(']') else { break };
        let Ok(i) = rest[..close].parse::<usize>() else { continue };
        if i != running.len() + 1 {
            if running.is_empty() {
                continue;
            }
            break;
        }
        let value = &rest[close + 1..];
        let end = value.find(|c: char| c == ',' || c.is_whitespace()).unwrap_or(value.len());
        match value[..end].parse::<f64>() {
            Ok(p) if p.is_finite() && p > 0.0 => running.push(p),
            _ if running.is_empty() => continue,
            _ => return Vec::new(),
        }
        rest = &value[end..];
    }
    let mut prev = 0.0;
    running
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let total = (i + 1) as f64 * p.ln();
            let chunk = total - prev;
            prev = total;
            chunk
        })
        .collect()
}

/// One of llama.cpp's KV types against its kvtide counterpart, window by window.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerGap {
    /// kvtide's cost over its dense f16 on all the windows.
    pub kvtide: f64,
    /// llama.cpp's cost over its f16 on all the windows.
    pub llamacpp: f64,
    /// `kvtide − llamacpp`.
    pub gap: f64,
    /// Leave-one-window-out jackknife standard error of `gap`.
    pub se: f64,
    /// `(kvtide cost, llama.cpp cost)` on each window alone.
    pub windows: Vec<(f64, f64)>,
}

impl PeerGap {
    /// The gap on each window alone.
    pub fn window_gaps(&self) -> impl Iterator<Item = f64> + '_ {
        self.windows.iter().map(|(k, l)| k - l)
    }
}

/// The cost over a reference of a configuration, from per-window mean NLLs over equally
/// many scored positions: `exp(mean(x) − mean(f16)) − 1` over the windows `keep` selects.
fn cost(x: &[f64], f16: &[f64], keep: impl Fn(usize) -> bool) -> f64 {
    let (mut d, mut n) = (0.0, 0usize);
    for (i, (a, b)) in x.iter().zip(f16).enumerate() {
        if keep(i) {
            d += a - b;
            n += 1;
        }
    }
    (d / n.max(1) as f64).exp() - 1.0
}

/// The gap between kvtide's and llama.cpp's costs over their own f16, with its jackknife
/// standard error over the windows. Each argument holds one mean NLL per window, over the
/// same scored positions; `None` unless all four have the same length of at least two.
pub fn peer_gap(kv: &[f64], kv_f16: &[f64], lc: &[f64], lc_f16: &[f64]) -> Option<PeerGap> {
    let n = kv.len();
    if n < 2 || kv_f16.len() != n || lc.len() != n || lc_f16.len() != n {
        return None;
    }
    let gap_without = |skip: Option<usize>| {
        let keep = |i: usize| Some(i) != skip;
        cost(kv, kv_f16, keep) - cost(lc, lc_f16, keep)
    };
    let loo: Vec<f64> = (0..n).map(|w| gap_without(Some(w))).collect();
    let mean = loo.iter().sum::<f64>() / n as f64;
    let var = loo.iter().map(|g| (g - mean).powi(2)).sum::<f64>() * (n - 1) as f64 / n as f64;
    let (kvtide, llamacpp) = (cost(kv, kv_f16, |_| true), cost(lc, lc_f16, |_| true));
    let windows =
        (0..n).map(|w| (cost(kv, kv_f16, |i| i == w), cost(lc, lc_f16, |i| i == w))).collect();
    Some(PeerGap { kvtide, llamacpp, gap: kvtide - llamacpp, se: var.sqrt(), windows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_nlls_undo_the_running_average() {
        let per = [4.0_f64, 4.6, 4.2];
        let mut text = String::from("perplexity: calculating perplexity over 3 chunks\n");
        let mut sum = 0.0;
        for (i, m) in per.iter().enumerate() {
            sum += m;
            text.push_str(&format!("[{}]{:.4},", i + 1, (sum / (i + 1) as f64).exp()));
        }
        text.push_str("\nFinal estimate: PPL = 77.0 +/- 1.2\n");
        let got = chunk_nlls(&text);
        assert_eq!(got.len(), 3);
        for (g, w) in got.iter().zip(per) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    #[test]
    fn chunk_nlls_skip_other_brackets_and_refuse_garbage() {
        let text = "[INFO] x [   0] load\n[1]54.5982,[2]54.5982,\n[7] later";
        let got = chunk_nlls(text);
        assert_eq!(got.len(), 2);
        assert!((got[1] - 54.5982_f64.ln()).abs() < 1e-9);
        assert!(chunk_nlls("[1]nan,[2]3.0,").is_empty());
        assert!(chunk_nlls("[1]-2.0,").is_empty());
        assert!(chunk_nlls("no figures").is_empty());
    }

    #[test]
    fn the_gap_is_the_cost_difference_and_its_error_follows_the_windows() {
        let f16 = [4.0, 4.2, 3.9, 4.1];
        // kvtide costs exactly 10 % more than llama.cpp's 5 % on every window: no spread.
        let kv: Vec<f64> = f16.iter().map(|m| m + 1.10_f64.ln()).collect();
        let lc: Vec<f64> = f16.iter().map(|m| m + 1.05_f64.ln()).collect();
        let g = peer_gap(&kv, &f16, &lc, &f16).unwrap();
        assert!((g.kvtide - 0.10).abs() < 1e-12 && (g.llamacpp - 0.05).abs() < 1e-12);
        assert!((g.gap - 0.05).abs() < 1e-12);
        assert!(g.se < 1e-12);
        assert!(g.window_gaps().all(|x| (x - 0.05).abs() < 1e-12));
        // One window carries the whole gap: the error is as large as the gap's share of it.
        let mut kv1 = lc.clone();
        kv1[2] += 0.4;
        let g = peer_gap(&kv1, &f16, &lc, &f16).unwrap();
        assert!(g.gap > 0.1 && g.se > 0.5 * g.gap, "{g:?}");
        let worst = g.window_gaps().fold(f64::MIN, f64::max);
        assert!((worst - g.windows[2].0 + g.windows[2].1).abs() < 1e-12);
    }

    #[test]
    fn the_gap_needs_two_windows_of_every_series() {
        assert!(peer_gap(&[1.0], &[1.0], &[1.0], &[1.0]).is_none());
        assert!(peer_gap(&[1.0, 2.0], &[1.0, 2.0], &[1.0], &[1.0, 2.0]).is_none());
    }
}
