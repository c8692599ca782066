#!/usr/bin/env python3
"""The equal-footing table of a frontier run, recomputed from its results.json.

A cross-check of `kvtide reproduce --only frontier --frontier-equal-footing`'s own table (the
same families, budgets, ratios and leave-one-window-out jackknife as
`kvtide/src/reproduce/frontier.rs::equal_footing_rows` and `frontier_peer.rs::peer_gap`), and
the table of a run whose binary still left f16-ring dense rows out of the dense family.

Usage: tables.py RESULTS_JSON [--brief]  (prints the Markdown table; --brief: one line per
budget with the best format overall, SWAN's best and the gap, without the header)
"""

import json
import math
import sys

BUDGETS = [0.12, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.55]
FAMILIES = ["dense", "kivi", "turbo", "swan"]


def family(run):
    if run["k"] is not None:
        return "swan"
    if run["family"] in ("kivi", "turbo"):
        return run["family"]
    plain = (
        run["family"] == "dense"
        and run["values"] != "f16"
        and run.get("value_rows") is None
        and run["queries"] == "f32"
        and run["sink"] == 0
        and run["ring"] in (None, "f16")
    )
    return "dense" if plain else None


def cost(x, f16, keep):
    d = [a - b for i, (a, b) in enumerate(zip(x, f16)) if keep(i)]
    return math.exp(sum(d) / max(len(d), 1)) - 1.0


def gap(a, b, f16):
    n = len(a)
    if n < 2 or len(b) != n or len(f16) != n:
        return None
    loo = [cost(a, f16, lambda i, w=w: i != w) - cost(b, f16, lambda i, w=w: i != w) for w in range(n)]
    mean = sum(loo) / n
    var = sum((g - mean) ** 2 for g in loo) * (n - 1) / n
    return cost(a, f16, lambda i: True) - cost(b, f16, lambda i: True), math.sqrt(var)


def main(path, brief=False):
    data = json.load(open(path))
    (key,) = [k for k in data if k.startswith("frontier")]
    study = data[key]
    windowed = study.get("local") is not None
    points = study["points"]
    ratio = (lambda p: p["global_long_ratio"]) if windowed else (lambda p: p["long_ratio"])
    f16 = next(p for p in points if p["label"] == "dense f16")
    base = f16["perplexity"]
    if not brief:
        print("| b | budget × f16 | best dense int8/int4 | best KIVI | best TurboQuant-style | best SWAN | SWAN − best other | resolved (> 2 SE) |")
        print("|---|---|---|---|---|---|---|---|")
    for b in sorted({p["run"]["buffer"] for p in points}):
        at = {f: [p for p in points if p["run"]["buffer"] == b and family(p["run"]) == f] for f in FAMILIES}
        if not at["swan"] or not any(at[f] for f in FAMILIES[:3]):
            continue
        for budget in BUDGETS:
            best = {}
            for f in FAMILIES:
                fit = [p for p in at[f] if ratio(p) <= budget]
                best[f] = min(fit, key=lambda p: p["perplexity"]) if fit else None
            others = [best[f] for f in FAMILIES[:3] if best[f]]
            other = min(others, key=lambda p: p["perplexity"]) if others else None
            cells = [
                f"{p['label']} ({ratio(p):.3f}; {100 * (p['perplexity'] / base - 1):.2f} %)" if p else "—"
                for p in (best[f] for f in FAMILIES)
            ]
            g = gap(best["swan"]["window_nll"], other["window_nll"], f16["window_nll"]) if best["swan"] and other else None
            if g:
                who = "SWAN" if g[0] < 0 else "other"
                verdict = f"yes: {who} better" if abs(g[0]) > 2 * g[1] else "no"
                text = f"{100 * g[0]:+.2f} ± {100 * g[1]:.2f} pp"
            else:
                verdict = text = "—"
            if brief:
                short = lambda p: f"{p['label'].replace(' ring=f16', '').replace(' b=128', '')} ({ratio(p):.3f}; {100 * (p['perplexity'] / base - 1):+.2f} %)" if p else "—"
                print(f"| {budget:.2f} | {short(other)} | {short(best['swan'])} | {text} |")
            else:
                print(f"| {b} | {budget:.2f} | " + " | ".join(cells) + f" | {text} | {verdict} |")


if __name__ == "__main__":
    main(sys.argv[1], "--brief" in sys.argv[2:])
