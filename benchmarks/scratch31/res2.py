import sys, statistics, collections
from benchmarks.estimator_quality import collect
from focus.noise_rows import collect as rows_of
from concurrent.futures import ProcessPoolExecutor
fam, budget, critic, nseeds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def one(args):
    method, seed = args
    batch, mdps, values, gamma, trees = collect((fam, 6, budget, critic, method, seed))
    out = collections.defaultdict(list)
    for t in trees:
        recs = []
        rows_of(t, gamma, "bootstrap", None, recs)
        for r in recs:
            if r.ss is not None and r.d2 is not None:
                out[(r.depth, getattr(r, "free", True))].append(r.d2 - r.ss / (r.m * (r.m - 1)))
    return method, dict(out)
jobs = [(m, s) for s in range(nseeds) for m in ("uniform", "selective")]
with ProcessPoolExecutor(2) as ex:
    res = list(ex.map(one, jobs))
for m in ("uniform", "selective"):
    agg = collections.defaultdict(list)
    for mm, o in res:
        if mm == m:
            for d, xs in o.items(): agg[d] += xs
    print(m, " ".join(f"{d[0]}{'F' if d[1] else 's'}:{statistics.mean(agg[d]):.4f}/{len(agg[d])}" for d in sorted(agg)))
