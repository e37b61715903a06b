"""Fitted estimator model per depth, mean over seeds, for uniform vs selective trees of one cell."""
import sys, statistics
from benchmarks.estimator_quality import collect
from focus.noise import noise_model
from concurrent.futures import ProcessPoolExecutor
fam, budget, critic, nseeds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
def one(args):
    method, seed = args
    batch, mdps, values, gamma, trees = collect((fam, 6, budget, critic, method, seed))
    nm = noise_model(trees, gamma=gamma)
    D = 10
    return method, [nm.step_var(d) for d in range(D)], [nm.noise_var(d) for d in range(D)], [nm.critic_at(d) for d in range(D)], nm.shared
jobs = [(m, s) for s in range(nseeds) for m in ("uniform", "selective")]
with ProcessPoolExecutor(2) as ex:
    res = list(ex.map(one, jobs))
for m in ("uniform", "selective"):
    rs = [r for r in res if r[0] == m]
    for i, name in ((1, "s"), (2, "nu"), (3, "t")):
        print(f"{m:9s} {name:3s}", " ".join(f"{statistics.mean(r[i][d] for r in rs):.4f}" for d in range(10)))
    print(f"{m:9s} shared {statistics.mean(r[4] for r in rs):.3f}")
from benchmarks.estimator_quality import make_critic
from benchmarks.priority_terms import exact_noise
from benchmarks.estimator_quality import ALL_FAMILIES
def ex(seed):
    f = ALL_FAMILIES[fam]
    mdps = [f.make(1000 * seed + i) for i in range(6)]
    values = [m.values(f.gamma) for m in mdps]
    crit = make_critic(critic, mdps, f.gamma, seed, f.max_steps)
    import dataclasses; nm = dataclasses.replace(exact_noise(mdps, values, f.gamma, crit, noise_model([], gamma=f.gamma)), known=True)
    return [nm.step_var(d) for d in range(10)], [nm.noise_var(d) for d in range(10)], [nm.critic_at(d) for d in range(10)]
rs = [ex(s) for s in range(nseeds)]
for i, name in ((0, "s"), (1, "nu"), (2, "t")):
    print(f"exact     {name:3s}", " ".join(f"{statistics.mean(r[i][d] for r in rs):.4f}" for d in range(10)))
