"""Gaps between kvtide's int4 costs (whole window through the cache) and llama.cpp's keys-q4_0
costs with each value type, on the 32 windows of ../results.json, with the leave-one-window-out
jackknife standard error (the study's own rule, kvtide/src/reproduce/frontier_peer.rs).
llama.cpp's per-chunk figures come from its running perplexities: ../results.json for the
runs the study made (-ctk/-ctv f16, q8_0, q4_0), the logs here for q4_0 keys with f16 / q8_0
values (`llama-perplexity -m <F32 GGUF> -f <the study's text> -c 1024 --chunks 32 -t 2 -fa on
-ctk q4_0 -ctv V`), and for the sweep below: q4_0 keys with q4_1 / q5_0 / q5_1 / iq4_nl values,
f16 or q8_0 keys with q4_0 values, and q4_0/q4_0 and q4_0/f16 with llama.cpp's rotation off
(`LLAMA_ATTN_ROT_DISABLE=1`)."""
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


# llama.cpp's own q4_0-key costs, value type by value type: a cache whose keys are stored
# identically, whose values differ by a few bits. Each line: the cost over llama.cpp's f16
# with its jackknife SE, and its distance from the q4_0/q4_0 run the study judges.
print()
print("llama.cpp, same q4_0 keys (Hadamard-rotated), values of each type:")
sweep = [
    ("q4_0 keys, f16 values", None),
    ("q4_0 keys, q8_0 values", None),
    ("q4_0 keys, q5_1 values", "k-q4_0-v-q5_1.log"),
    ("q4_0 keys, q5_0 values", "k-q4_0-v-q5_0.log"),
    ("q4_0 keys, q4_1 values", "k-q4_0-v-q4_1.log"),
    ("q4_0 keys, iq4_nl values", "k-q4_0-v-iq4_nl.log"),
    ("q4_0", None),
]
for name, log in sweep:
    if log is not None:
        if not os.path.exists(os.path.join(here, log)):
            continue
        lc[name] = chunks(log)
    c, _, g, se = gap(lc[name], lc["f16"], lc["q4_0"], lc["f16"])
    print(f"  {name:28s} {100*c:6.2f} %   vs q4_0/q4_0 {100*g:+6.2f} pp, SE {100*se:.2f}")
print("llama.cpp, other pairs:")
for name, log in [
    ("f16 keys, q4_0 values", "k-f16-v-q4_0.log"),
    ("q8_0 keys, q4_0 values", "k-q8_0-v-q4_0.log"),
    ("q4_0/q4_0, rotation off", "norot-q4_0-q4_0.log"),
    ("q4_0 keys, f16 values, rotation off", "norot-q4_0-f16.log"),
]:
    lc[name] = chunks(log)
    c, _, g, se = gap(lc[name], lc["f16"], lc["q4_0"], lc["f16"])
    print(f"  {name:36s} {100*c:6.2f} %   vs q4_0/q4_0 {100*g:+6.2f} pp, SE {100*se:.2f}")
