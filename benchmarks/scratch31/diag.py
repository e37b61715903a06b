"""Where do selective and uniform differ in one cell: continuations by depth, neutral error by depth."""
import sys, collections, json
from benchmarks.estimator_quality import collect, score, neutral_mse, seeds_at
from focus.synthetic_hard import depths
from concurrent.futures import ProcessPoolExecutor

fam, budget, critic = sys.argv[1], int(sys.argv[2]), sys.argv[3]
nseeds = int(sys.argv[4]) if len(sys.argv) > 4 else 22
methods = ["grpo", "uniform", "selective"]

def one(args):
    method, seed = args
    batch, mdps, values, gamma, trees = collect((fam, 6, budget, critic, method, seed))
    sc = score(batch, mdps, values, gamma)
    starts = collections.Counter()
    for t in trees:
        for n in t.nodes.values() if hasattr(t.nodes, "values") else t.nodes:
            ch = getattr(n, "children", ())
            if len(ch) > 1:
                starts[getattr(n, "depth", -1)] += len(ch) - 1
    dep = [depths(m) for m in mdps]
    pairs = {k: tuple(v) for k, v in sc["_pairs"].items()}
    return method, seed, pairs, dict(starts), dep

jobs = [(m, s) for s in range(nseeds) for m in methods]
with ProcessPoolExecutor(2) as ex:
    res = list(ex.map(one, jobs))
by = collections.defaultdict(dict)
for m, s, pairs, starts, dep in res:
    by[s][m] = (pairs, starts, dep)
err_d = {m: collections.Counter() for m in methods}
tot = {m: 0.0 for m in methods}
st = {m: collections.Counter() for m in methods}
for s, d in by.items():
    shared = set.intersection(*(set(d[m][0]) for m in methods))
    den = sum(d["uniform"][0][k][2] for k in shared if d["uniform"][0][k][1] > 0)
    for m in methods:
        pairs, starts, dep = d[m]
        st[m].update(starts)
        tot[m] += neutral_mse(pairs, shared)
        for k in shared:
            se, w, p = pairs[k]
            if w > 0 and p > 0:
                err_d[m][dep[k[0]][k[1]]] += p * se / w / den
print(f"{fam}/{budget}H/{critic}, {nseeds} seeds: neutral sel/uni {tot['selective']/tot['uniform']:.3f}  uni {tot['uniform']/nseeds:.5f} sel {tot['selective']/nseeds:.5f}")
D = sorted(set().union(*[set(e) for e in err_d.values()]))
print("depth  neutral-err uni  sel   | extra children uni  sel")
for dd in D:
    print(f"{dd:5d}  {err_d['uniform'][dd]/nseeds:.5f} {err_d['selective'][dd]/nseeds:.5f} | {st['uniform'][dd]/nseeds:6.1f} {st['selective'][dd]/nseeds:6.1f}")
