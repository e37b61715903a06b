"""What each configuration field means, written once and rendered where people read it.

:data:`MEANING` holds one line per field (markdown). From it, and from the schema's
defaults, come docs/pipeline.md's "Configuration reference" table, the comment above
each key of configs/*.toml, and the description of each field in the Prefect UI's run
form (:mod:`tasks.config.form`). ``python -m tasks.config.reference`` rewrites the
table and the comments; ``--check`` only reports what is out of date (a test runs it).

In a TOML file, the comment lines directly above a key are its meaning and are
rewritten; a note about the value a file chose goes at the end of the key's line
(``max_tokens = 4  # ...``), a note about a table after its header, followed by a
blank line.
"""

from __future__ import annotations

import functools
import json
import re
import textwrap
from pathlib import Path
from typing import Any

from focus.priority import Selective
from tasks.config.parts import ESTIMATOR_KNOBS
from tasks.config.schema import FocusConfig, field_paths
from tasks.config.search import SELECTIVE_KNOBS

#: One line per field: what it does and what its values mean (markdown).
MEANING: dict[str, str] = {
    "collection_id": "name of the collection in storage; the same id resumes it (unset: derived from the flow run); "
    "the train loop's base name",
    "iteration": "training iteration recorded in the batch (the train loop sets it per iteration)",
    "seed": "collection seed; every rollout's sampling seed derives from it",
    "progress": "live progress on a terminal (a collection's bars; a train loop's stages, rows and picture), else "
    "log lines: a phase's first wave, each tenth of its budget, at least one a minute",
    "model.kind": "`local` (the embedded tiny model) \\| `openai` (vLLM, any OpenAI-compatible server) \\| `sglang` "
    "\\| `llamacpp` (llama.cpp's llama-server) \\| `tinker` \\| `factory`",
    "model.url": "server root (not an endpoint such as `/v1/chat/completions`); required for `openai`/`sglang`/"
    "`llamacpp`; for `local`, unset starts the embedded server for the run",
    "model.urls": "several replicas of the model instead of `url` (`openai`/`sglang`/`llamacpp`): each call goes where the "
    'prefix it continues is cached, and to another replica when one is down (docs/model-services.md, "Several replicas")',
    "model.model": "served model name sent with each request; for `tinker` the base model",
    "model.weights": "`local`: weights file the embedded server starts from (path or URL; unset: the committed "
    "weights); `tinker`: a `tinker://` sampler path",
    "model.policy_version": "version recorded in batch rows when the server reports none",
    "model.factory": "with kind `factory`: import path of a callable returning a `focus.policy.Policy`",
    "model.options": "keyword options of the policy client (or of the factory)",
    "model.vocab_size": "token ids the model knows; a sampled id outside fails its rollout (unset: asked from the "
    "embedded server, else the env codec's tokenizer)",
    "model.group_siblings": "send the first calls of sibling rollouts as one request with `n` samples (`local`, "
    '`openai`: vLLM\'s rule, sample i with seed + i, checked once; docs/model-services.md, "Siblings in one request"); '
    "the batch is the same either way",
    "model.api_key_env": "name of the environment variable holding the model service's API key (a server started "
    "with `--api-key`), sent as `Authorization: Bearer`; read where the client is built, never stored or logged; "
    "unset: no key",
    "model.http.timeout_s": "seconds one attempt waits for its answer",
    "model.http.connect_timeout_s": "seconds to open a connection",
    "model.http.max_retries": "retries after the first attempt",
    "model.http.backoff_s": "backoff base: the wait before retry n is drawn from [0, min(`backoff_max_s`, "
    "`backoff_s`·2^n)]",
    "model.http.backoff_max_s": "backoff cap",
    "model.http.jitter": "full jitter (false: wait exactly the cap)",
    "model.http.deadline_s": "seconds one call may take, attempts and waits included",
    "model.http.outage_wait_s": "seconds a service that answers nobody (refused, reset, 502/503/504: a restart; "
    "429 to every request: a rate limit) is waited for before the calls fail (0: fail within the ordinary retries)",
    "model.http.first_contact_s": "seconds the command (a flow run, once it has work to do) tries to connect to the "
    "service before anything starts; none in that time (a wrong port or host, a server not started) stops it with one "
    "line. Raise it for a server that opens its port only once its weights are loaded (SGLang)",
    "model.http.silence_warn_s": "seconds with no answer while requests wait before one warning line names the "
    "URL and the requests waiting (looked at every quarter of it; null: never)",
    "model.http.hedge_after_s": "a fixed hedge delay in seconds, instead of the adaptive one",
    "model.http.adaptive_hedge": "send a copy of a seeded request that has waited twice the recent p99 latency of "
    'its endpoint and size class; first good answer wins (docs/model-services.md, "Hedging")',
    "env.kind": "`reach_target` (the toy task) \\| `factory` (returns `(env, format, tasks)`)",
    "env.n_tasks": "tasks in a collection (per iteration in the train loop, fresh ones each iteration)",
    "env.task_seed": "seed the tasks are drawn with (iteration i of a train loop: a seed derived from it and i)",
    "env.factory": "with kind `factory`: import path called with `n_tasks`, `seed` and the options",
    "env.options": "keyword options of the env (or of the factory)",
    "agent.max_steps": "most rollout steps from the root (model calls, compactions included)",
    "agent.context.kind": "`segments` (a new context per segment) \\| `append_only` \\| `summarize` (segments, "
    "compacted by a model call once the prompt passes `options.max_prompt_tokens`: `focus.context.Summarize`) \\| "
    '`factory`; a kind\'s name alone (`context = "append_only"`) is the table with that kind',
    "agent.context.factory": "with kind `factory`: import path of a callable returning a "
    "`focus.context.ContextManager`, called with the options",
    "agent.context.options": "keyword options of `summarize` (`max_prompt_tokens`, `instruction`, "
    "`train_on_summary`) or of the factory",
    "agent.branch_points.kind": "`every` (a checkpoint at every decision) \\| `sparse` (every `sparse_every` "
    "decisions) \\| `factory`; a kind's name alone is the table with that kind",
    "agent.branch_points.factory": "with kind `factory`: import path of a callable returning a "
    "`focus.branching.BranchPoints`, called with the options",
    "agent.branch_points.options": "keyword options of `sparse` (`offset`, `max_step`, `min_prompt_tokens`) or of "
    "the factory",
    "agent.sparse_every": "with `sparse`: a checkpoint every this many decisions",
    "agent.sampling.max_tokens": "most tokens of one model response",
    "agent.sampling.temperature": "sampling temperature (the local trainer needs > 0, or `train.local.temperature` set)",
    "agent.sampling.top_p": "nucleus mass (the local trainer needs 1)",
    "agent.sampling.stop": "stop strings",
    "agent.sampling.stop_token_ids": "stop token ids",
    "agent.sampling.seed": "a fixed sampling seed (unset: one per step, derived from `seed`)",
    "search.kind": "`selective` (continue where the critic's error shrinks most) \\| `uniform` (spread evenly) "
    "\\| `factory`",
    "search.factory": "with kind `factory`: import path of a callable returning a `focus.priority.Priority` (a "
    "subclass is one), called with `phases`, `waves_in_flight` and the options, which it keeps",
    "search.options": "keyword options of the factory (its priority's own parameters)",
    "search.waves_in_flight": "waves planned and running at once: 2 keeps the model service busy while a wave's "
    'last rollouts finish (docs/pipeline.md, "Waves in flight"); 1 runs one wave at a time',
    "search.explore": "with kind `selective`: the share of continuations placed independently of the critic and of "
    'every outcome seen, by a fixed hash of the slot (`focus.priority.Selective.explore`; docs/algorithm.md, "The '
    'exploration share")',
    "search.depth_share": "with kind `selective`: a bound on one depth's continuations in a phase, at most this "
    "many times uniform branching's share for that depth, plus one (0: no bound; "
    '`focus.priority.Selective.depth_share`; docs/algorithm.md, "Depth share")',
    "search.phases": "the phases, in order (`focus.priority.Phase`); only the first may be an evidence phase",
    "search.phases[].name": "unique name of the phase",
    "search.phases[].rollouts_per_task": "makes an evidence phase (first phase only): complete rollouts per root",
    "search.phases[].transitions": "task-transition budget of a continuation phase, spent in waves from the best "
    "checkpoints",
    "search.phases[].wave_size": "how much one wave starts, in `wave_unit` (not used by an evidence phase)",
    "search.phases[].wave_unit": "`transitions`: a wave starts continuations until their expected task transitions "
    "reach `wave_size` half rollouts, so short ones make fuller waves (benchmarks/README.md, "
    '"Wave barriers") \\| `jobs`: `wave_size` continuations',
    "search.phases[].max_branches": "most continuations started from one checkpoint",
    "search.phases[].max_depth": "deepest checkpoint continued (root = 0)",
    "search.phases[].max_waves": "most waves of the phase (unset: until the budget is spent)",
    "critic.kind": "`constant` \\| `http` (a scoring service) \\| `local` (a small trainable critic, "
    "`focus.critic.LocalCritic`) \\| `factory`",
    "critic.value": "with kind `constant`: the prediction at every checkpoint",
    "critic.url": "with kind `http`: the scoring service's URL",
    "critic.api_key_env": "with kind `http`: name of the environment variable holding the scoring service's API "
    "key, as `model.api_key_env`; unset: no key",
    "critic.weights": "with kind `local`: a saved critic to start from (the train loop sets it to each new version's)",
    "critic.factory": "with kind `factory`: import path of a callable returning a `focus.critic.Critic`",
    "critic.options": "keyword options of the critic (or of the factory)",
    "estimator.kind": "`direct_branch_td` (`focus.estimation.DirectBranchTd`) \\| `group_normalized` (the "
    "GRPO-style baseline, `GroupNormalized`) \\| `node_monte_carlo` (the VinePPO-style baseline, `NodeMonteCarlo`) "
    "\\| `factory`",
    "estimator.gamma": "discount per task transition (the search ranks with the same γ)",
    "estimator.kappa": "fixed weight of the critic's prediction (pseudo-counts) in refined values (unset: fitted "
    "from the collection's residuals, docs/algorithm.md)",
    "estimator.truncation": "a truncated leaf (`max_steps`) bootstraps from the critic (`bootstrap`) or counts as "
    "terminal (`terminal`)",
    "estimator.scale": "with kind `group_normalized`: divide by the group's standard deviation (false: centre only, "
    "Dr. GRPO; `focus.estimation.GroupNormalized.scale`)",
    "estimator.eps": "with kind `group_normalized`: added to the standard deviation "
    "(`focus.estimation.GroupNormalized.eps`)",
    "estimator.factory": "with kind `factory`: import path of a callable returning a `focus.estimation.Estimator` "
    "(a subclass is one), called with `gamma`, `kappa`, `truncation` and the options, which it keeps",
    "estimator.options": "keyword options of the factory (its estimator's own parameters)",
    "execution.kind": "`local` (in-process asyncio) \\| `dask` (a LocalCluster unless `address` is set; an "
    "`address` selects `dask`) \\| `factory`",
    "execution.factory": "with kind `factory`: import path of a callable returning a `focus.execution.Execution`, "
    "called with `max_concurrency`, `max_outage_share` and the options (where things run: not compared on resume)",
    "execution.options": "keyword options of the factory",
    "execution.address": "an existing Dask scheduler",
    "execution.n_workers": "LocalCluster workers",
    "execution.threads_per_worker": "threads per LocalCluster worker",
    "execution.processes": "LocalCluster workers are processes (false: threads)",
    "execution.max_concurrency": "model calls in flight per process",
    "execution.shard_size": "rollouts per Dask task",
    "execution.no_workers_timeout_s": "seconds a wave waits while the Dask scheduler has no workers (all died, "
    "none joined yet) before the collection fails with one line; workers joining in time pick it up",
    "execution.heartbeat_s": "seconds between the heartbeats a running collection sends the Prefect server (a "
    'watchdog marks a silent run Crashed: docs/pipeline.md, "Node loss")',
    "execution.prefect_grace_s": "seconds a flow run goes on while its Prefect server answers no health check "
    "before it stops with one line (a shorter outage, a restart, fails nothing: docs/operations.md)",
    "execution.max_outage_share": "share of a wave's rollouts that may fail for want of the model service before "
    "the wave fails with `ModelServiceOutage` (1.0: keep such failed rollouts in the batch; a bad response "
    "stops the collection at its wave whatever the share, docs/model-services.md)",
    "storage.root": "a folder or an fsspec URL (`s3://bucket/prefix`, `memory://...`): batches, checkpoints and "
    "weights live under it",
    "storage.read_ahead.threads": "threads a resume reads its saved steps in, ahead of the replay "
    '(docs/operations.md, "A large collection")',
    "storage.read_ahead.window": "saved steps ahead of the replay whose manifest is read",
    "storage.read_ahead.max_mib": "MiB of checkpoint data read ahead and not yet replayed (one file is read "
    "whatever its size)",
    "train.iterations": "collect/train rounds",
    "train.trainer": "`local` (the embedded model) \\| `tinker` (LoRA on Tinker; a dry run without "
    "`TINKER_API_KEY`) \\| `package.module:function` (your trainer; the current folder is on the import path)",
    "train.options": "keyword options of a trainer named by import path",
    "train.eval_tasks": "held-out tasks evaluated (one plain rollout each) before training and after each "
    "iteration (0: off)",
    "train.local.lr": "AdamW learning rate (`rule` adam)",
    "train.local.epochs": "passes over each batch (`rule` adam)",
    "train.local.minibatch": "sequences per optimizer step (`rule` adam)",
    "train.local.clip": "PPO clip range of the importance ratio",
    "train.local.max_grad_norm": "gradient norm clip (`rule` adam)",
    "train.local.temperature": "temperature of the trained log-probs (unset: `agent.sampling.temperature`)",
    "train.local.scale_advantages": "advantages scaled to unit standard deviation (mean kept): `batch` (true) "
    "over the batch \\| `task` over each task's trained tokens \\| `none` (false)",
    "train.local.weight_decay": "AdamW weight decay (`rule` adam)",
    "train.local.torch_threads": "torch threads during an update",
    "train.local.pack": "how sequences share forward passes: `tree` (true; prefix packing, and every forward "
    "pass laid out as a token trie, each shared token once) \\| `prefixes` (a sequence that is a prefix of another "
    "rides in it) \\| `none` (false)",
    "train.local.target_kl": "the update's size in approximate KL(behaviour \\|\\| policy): `sgd`/`natural` "
    "search the step's length to within 10% of it; `adam` stops once a minibatch passes it, and an epoch that adds "
    "more than twice this over the batch is undone and run again at half the learning rate, up to 4 times "
    "(unset, `adam` only: no stop)",
    "train.local.segment_weights": "loss weight of a tree's segments: `equal` \\| `siblings` \\| `reach` "
    '(docs/algorithm.md, "The local trainer")',
    "train.local.rule": "`sgd` \\| `natural`: one step along the batch's gradient / natural gradient sized to "
    '`target_kl` by a line search \\| `adam`: AdamW epochs over minibatches (docs/algorithm.md, "The local trainer")',
    "train.local.steps": "`sgd` \\| `natural`: steps per update, each along the gradient at the weights the one "
    "before left and sized to `target_kl` / steps from them, ending once the batch's KL reaches `target_kl` "
    "(1: one step)",
    "train.local.cg_iterations": "`natural`: conjugate-gradient iterations",
    "train.local.damping": "`natural`: damping added to the Fisher",
    "train.local.seed": "seeds the minibatch order",
    "train.tinker.base_model": "model to fine-tune (unset: `model.model`)",
    "train.tinker.lora_rank": "LoRA rank of a new training run",
    "train.tinker.loss_fn": "`importance_sampling` \\| `ppo` \\| `cispo` \\| `gspo`",
    "train.tinker.learning_rate": "Adam learning rate",
    "train.tinker.seed": "seed of the LoRA initialisation",
    "train.tinker.ttl_seconds": "lifetime of saved Tinker checkpoints in seconds (unset: kept)",
    "train.tinker.dry_run": "build and check every request, send none",
}

#: Each field of ``critic.http`` means what the same field of ``model.http`` does;
#: the reference lists them after ``critic.options``.
SHARED = {"critic.http.": ("model.http.", "for the HTTP critic's client (kind `http`)", "critic.options")}

#: The reference's tables: heading, and the dotted prefixes of the fields each lists.
SECTIONS: list[tuple[str, tuple[str, ...]]] = [
    ("Top level:", ("collection_id", "iteration", "seed", "progress")),
    ("`model` - the policy's model service:", ("model.",)),
    ("`env` - the task set:", ("env.",)),
    ("`agent` - one rollout:", ("agent.",)),
    ("`search` - where the budget goes:", ("search.",)),
    ("`critic`, `estimator`:", ("critic.", "estimator.")),
    ("`execution`, `storage`:", ("execution.", "storage.")),
    ("`train` - the train loop (`focus train`):", ("train.",)),
]

#: Defaults the schema cannot print as one value.
DEFAULT_TEXT = {"search.phases": "evidence 4 per task, then 200 transitions", "search.phases[].name": "-"}

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pipeline.md"
START = "<!-- config-reference: rendered by python -m tasks.config.reference from tasks/config/reference.py -->"
END = "<!-- end of config-reference -->"


def reference_paths() -> list[str]:
    """Every field the reference documents (``search.phases`` itself besides its entries'
    fields), in :data:`MEANING`'s order."""
    paths: list[str] = []
    for path in field_paths(into_lists=True):
        head = path.split("[]", 1)[0]
        if "[]" in path and head not in paths:
            paths.append(head)
        paths.append(path)
    order = list(MEANING)

    def rank(path: str) -> tuple[int, int]:
        for prefix, (_, _, after) in SHARED.items():
            if path.startswith(prefix):
                return order.index(after), paths.index(path)
        return order.index(path) if path in order else len(order), 0

    return sorted(paths, key=rank)


def meaning(path: str) -> str:
    """The field's line (markdown); ``KeyError`` for a field nobody described."""
    for prefix, (other, note, _) in SHARED.items():
        if path.startswith(prefix):
            return f"as `{other}{path.removeprefix(prefix)}`, {note}"
    return MEANING[path]


def _default(path: str) -> Any:
    """The default of a field: an attribute of the default configuration (a section's
    default may differ from its model's: ``agent.sampling.max_tokens``), or for a phase's
    field the :class:`focus.priority.Phase` default (``...`` when it has none)."""
    if "[]" in path:
        head, _, name = path.partition("[].")
        item = type(_attribute(_defaults(), head)[0])
        info = item.model_fields[name]
        return ... if info.is_required() else info.get_default(call_default_factory=True)
    return _attribute(_defaults(), path)


@functools.cache
def _defaults() -> FocusConfig:
    return FocusConfig()


def _attribute(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def default_text(path: str, *, code: bool = True) -> str:
    """The default as the reference writes it: ``unset`` for none, TOML-like values; for
    a search knob, the library's default it stands for (read off the library's field)."""
    if path in DEFAULT_TEXT:
        return DEFAULT_TEXT[path]
    if (knob := path.removeprefix("search.")) in SELECTIVE_KNOBS:
        return f"unset (the library's: {default_text_of(Selective.model_fields[knob].default, code=code)})"
    if (knob := path.removeprefix("estimator.")) in ESTIMATOR_KNOBS["group_normalized"]:
        from focus.estimation import GroupNormalized

        return f"unset (the library's: {default_text_of(GroupNormalized.model_fields[knob].default, code=code)})"
    return default_text_of(_default(path), code=code)


def default_text_of(value: Any, *, code: bool = True) -> str:
    """A default value as the reference writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    text = json.dumps(list(value) if isinstance(value, tuple) else value)
    text = text.strip('"') if isinstance(value, str) else text
    return f"`{text}`" if code else text


def render_reference() -> str:
    """The tables of docs/pipeline.md's "Configuration reference", between the markers."""
    paths = reference_paths()
    parts = [START]
    for heading, prefixes in SECTIONS:
        rows = [p for p in paths if any(p == x or (x.endswith(".") and p.startswith(x)) for x in prefixes)]
        parts += ["", heading, "", "| field | default | meaning |", "|---|---|---|"]
        parts += [f"| `{p}` | {default_text(p)} | {meaning(p)} |" for p in rows]
    return "\n".join([*parts, "", END])


def plain(text: str) -> str:
    """A meaning as a TOML comment says it: no markdown."""
    return text.replace("\\|", "|").replace("`", "")


_TABLE = re.compile(r"^\[(\[)?([\w.]+)\]?\]$")
_KEY = re.compile(r"^(#\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*=")


def _key_path(line: str, table: str) -> str | None:
    """The field a TOML line sets or shows commented out, if it names one."""
    m = _KEY.match(line.strip())
    if m is None:
        return None
    path = table + m.group(2)
    return path if path in MEANING or path.startswith(tuple(SHARED)) else None


def render_toml(text: str) -> str:
    """``text`` (a configs/*.toml) with the meaning of each key written above it."""
    out: list[str] = []
    table = ""
    for line in text.splitlines():
        stripped = line.strip()
        if m := _TABLE.match(stripped):
            table = m.group(2) + ("[]." if m.group(1) else ".")
        elif (path := _key_path(line, table)) is not None:
            while out and out[-1].startswith("#") and _key_path(out[-1], table) is None:
                out.pop()  # the meaning written last time
            out += textwrap.wrap(
                plain(meaning(path)[0].upper() + meaning(path)[1:]) + ".",
                88,
                initial_indent="# ",
                subsequent_indent="# ",
                break_on_hyphens=False,
            )
        out.append(line)
    return "\n".join(out) + "\n"


def rendered() -> dict[Path, str]:
    """What docs/pipeline.md and configs/*.toml hold when they are up to date."""
    doc = DOC.read_text(encoding="utf-8")
    head, start, rest = doc.partition(START)
    _, end, tail = rest.partition(END)
    if not (start and end):
        raise SystemExit(f"{DOC}: the markers of the configuration reference are missing")
    out = {DOC: head + render_reference() + tail}
    for path in sorted((ROOT / "configs").glob("*.toml")):
        out[path] = render_toml(path.read_text(encoding="utf-8"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Rewrite what is out of date (``--check``: only list it; exit 1 if anything is)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tasks.config.reference", description=main.__doc__)
    ap.add_argument("--check", action="store_true", help="only list what is out of date; exit 1 if anything is")
    check = ap.parse_args(argv).check
    stale = [path for path, text in rendered().items() if path.read_text(encoding="utf-8") != text]
    for path in stale:
        if check:
            print(f"{path.relative_to(ROOT)} is out of date: run python -m tasks.config.reference")
        else:
            path.write_text(rendered()[path], encoding="utf-8")
            print(f"rewrote {path.relative_to(ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
