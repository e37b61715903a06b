import json, sys
keys = ["neutral_selective_vs_uniform_noisy","neutral_selective_vs_uniform_constant","neutral_selective_vs_grpo_noisy","neutral_selective_vs_uniform_depth","selective_vs_uniform_noisy","selective_vs_uniform_constant"]
files = sys.argv[1:]
ds = [json.load(open(f)) for f in files]
ds = [d.get("figures", d) for d in ds]
allk = list(ds[0]["summary"].keys())
for k in allk:
    if not any(w in k for w in ("neutral", "selective_vs_uniform", "selective_vs_grpo_noisy", "critic")): continue
    print(f"{k:55s}", "  ".join(f"{d['summary'][k]['median']:.3f} (w {d['summary'][k]['worst']:.2f} {d['summary'][k]['worst_cell']})" for d in ds if k in d['summary']))
for d, f in zip(ds, files):
    print(f, "neutral above:", d["summary"].get("neutral_above", ""))
