"""Gaps between kvtide's int4 costs (whole window through the cache) and llama.cpp's keys-q4_0
costs with each value type, on the 32 windows of ../results.json, with the leave-one-window-out
jackknife standard error (the study's own rule, kvtide/src/reproduce/frontier_peer.rs).
llama.cpp's per-chunk figures come from its running perplexities: ../results.json for the
runs the study made (-ctk/-ctv f16, q8_0, q4_0), the logs here for q4_0 keys with f16 / q8_0
values (`llama-perplexity -m <F32 GGUF> -f <the study's text> -c 1024 --chunks 32 -t 2 -fa on
-ctk q4_0 -ctv V`)."""
import json, math, os, re

here = os.path.dirname(os.path.abspath(__file__))
doc = json.load(open(os.path.join(here, "..", "results.json")))
leg = next(v for v in doc.values() if isinstance(v, dict) and v.get("whole_window_nll"))
kv = dict((k, v) for k, v in leg["whole_window_nll"])
lc = dict((k, v) for k, v in leg["external"]["windows"])


def chunks(name):
    text = open(os.path.join(here, name)).read()
    running = [float(p) for _, p in re.findall(r"\[(\d+)\]([0-9.]+),", text)]
    out, prev = [], 0.0
    for i, p in enumerate(running):
        total = (i + 1) * math.log(p)
        out.append(total - prev)
        prev = total
    return out


lc["q4_0 keys, f16 values"] = chunks("k-q4_0-v-f16.log")
lc["q4_0 keys, q8_0 values"] = chunks("k-q4_0-v-q8_0.log")


def cost(x, f16, keep):
    d = [a - b for i, (a, b) in enumerate(zip(x, f16)) if keep(i)]
    return math.exp(sum(d) / len(d)) - 1


def gap(a, a16, b, b16):
    n = len(a)
    loo = [cost(a, a16, lambda i: i != w) - cost(b, b16, lambda i: i != w) for w in range(n)]
    m = sum(loo) / n
    se = math.sqrt((n - 1) / n * sum((x - m) ** 2 for x in loo))
    ca, cb = cost(a, a16, lambda i: True), cost(b, b16, lambda i: True)
    return ca, cb, ca - cb, se


for label in ["dense int4 rotate=hadamard", "dense int4 rotate=hadamard-v"]:
    for ty in ["q4_0", "q4_0 keys, f16 values", "q4_0 keys, q8_0 values"]:
        k, l, g, se = gap(kv[label], kv["dense f16"], lc[ty], lc["f16"])
        print(f"{label} ({100*k:.2f} %) vs llama.cpp {ty} ({100*l:.2f} %): {100*g:+.2f} pp, SE {100*se:.2f}")
k, l, g, se = gap(lc["q4_0"], lc["f16"], lc["q4_0 keys, f16 values"], lc["f16"])
print(f"llama.cpp q4_0/q4_0 ({100*k:.2f} %) vs q4_0 keys, f16 values ({100*l:.2f} %): {100*g:+.2f} pp, SE {100*se:.2f}")
