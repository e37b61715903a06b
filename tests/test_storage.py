"""Batch and checkpoint stores on memory:// and local folders: round trips, idempotence, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
import random
import re
from collections.abc import Sequence

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from focus.agent import Agent, BranchState
from focus.batch import ActorRow, Batch, CriticRow
from focus.env import Task
from focus.format import ByteCodec, PolicyFormat, XmlToolCallParser
from focus.policy import Completion, SamplingParams
from focus.testing import ScriptedPolicy, run
from focus.tools import Tool, ToolEnv
from focus.tree import Tree
from focus.workspace import DirectoryWorkspace
from storage import (
    BatchExistsError,
    BatchNotFound,
    BatchStore,
    CheckpointNotFound,
    CheckpointStore,
    CorruptDataError,
    ManifestError,
    PathOutsideRoot,
    Retry,
    SchemaError,
    StorageUnavailable,
)
from storage.urls import Location, retrying

# --- real test data: rollouts of an Agent, grown into a branching tree ----------------------


class VaryingLogprobPolicy(ScriptedPolicy):
    """Scripted texts with distinct, awkward log-probs, so a lossy float column would show."""

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        c = await super().sample(prompt_ids, params)
        lps = tuple(-((i * 0.1234567891011 + len(prompt_ids) * 1e-7) % 7.0) - 1e-12 for i in range(len(c.token_ids)))
        return Completion(c.token_ids, lps, c.finish_reason)


async def _note(args, ctx):
    ctx.workspace.write_text(f"notes/{len(ctx.workspace.list())}.txt", args["text"])
    return f"saved {len(ctx.workspace.list())} notes"


CALL = '<tool_call>{"name": "note", "arguments": {"text": "x"}}</tool_call>'


def make_agent(answers: Sequence[str] = ("<answer>42</answer>",)) -> Agent:
    note = Tool(
        "note",
        "save a note",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        _note,
    )
    env = ToolEnv(
        [note],
        judge=lambda task, ans: float(ans == task.data["answer"]),
        workspace_factory=lambda t: DirectoryWorkspace(),
    )
    codec = ByteCodec()
    policy = VaryingLogprobPolicy([CALL, CALL, *answers], codec)
    return Agent(policy, env, PolicyFormat(codec, XmlToolCallParser()), max_steps=6)


def graft(tree: Tree, node_id: int, rollout) -> None:  # type: ignore[no-untyped-def]
    parent = node_id
    for piece in rollout.pieces:
        node = tree.add_node(parent, piece.turns, piece.kind, steps=piece.steps, context_ids=piece.context_ids)
        if piece.state is not None:
            tree.states[node.id] = piece.state
        parent = node.id


def grow_tree(task_id: str = "t1", branches: int = 2) -> Tree:
    """A root rollout, then ``branches`` continuations from its first checkpoint."""
    agent = make_agent(["<answer>42</answer>", "<answer>7</answer>"])
    task = Task(task_id, {"prompt": f"say 42 ({task_id})", "answer": "42"})
    root = run(agent.start(task))
    tree = Tree.new(task.id, root, root.context.prompt_ids)
    graft(tree, 0, run(agent.rollout(root, seed=0)))
    first_cp = next(n.id for n in tree.checkpoints() if n.id != 0)
    for b in range(branches):
        graft(tree, first_cp, run(agent.rollout(tree.states[first_cp], seed=b + 1)))
    return tree


def batch_from_trees(trees: Sequence[Tree], collection_id: str = "c1", iteration: int = 0) -> Batch:
    """Actor rows per turn and critic rows per checkpoint, with made-up learning signals."""
    actor, critic = [], []
    for ti, tree in enumerate(trees):
        tree_id = f"{tree.task_id}-{ti}"
        for e in tree.edges.values():
            adv = math.sin(e.id + 0.5) / 3
            for k, t in enumerate(e.turns):
                actor.append(
                    ActorRow(
                        collection_id,
                        iteration,
                        tree.task_id,
                        tree_id,
                        e.parent,
                        e.id,
                        k,
                        "v0",
                        t.prompt_ids,
                        t.completion_ids,
                        t.logprobs,
                        (t.loss_mask,) * len(t.completion_ids),
                        adv,
                        t.reward,
                        t.finish_reason,
                        t.kind,
                    )
                )
        for n in tree.checkpoints():
            critic.append(
                CriticRow(
                    collection_id,
                    iteration,
                    tree.task_id,
                    tree_id,
                    n.id,
                    n.context_ids,
                    1 / (n.id + 3),
                    float(len(n.children)),
                    None if n.id % 2 else 0.25 + n.id / 100,
                )
            )
    stats = {
        "transitions": sum(t.stats()["transitions"] for t in trees),
        "wall_s": random.random(),
        "phases": {"evidence": {"rollouts": len(trees)}},
    }
    return Batch(collection_id, iteration, actor, critic, stats)


@pytest.fixture(scope="module")
def trees() -> list[Tree]:
    return [grow_tree("t1"), grow_tree("t2", branches=1)]


@pytest.fixture(scope="module")
def batch(trees) -> Batch:
    return batch_from_trees(trees)


def _root(tmp_path, kind: str) -> str:
    return {
        "memory": f"memory://store-{os.urandom(6).hex()}",
        "file": f"file://{tmp_path}/store",
        "path": str(tmp_path / "p"),
    }[kind]


# --- batches ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "file", "path"])
def test_batch_round_trip_is_exact(tmp_path, batch, kind):
    store = BatchStore(_root(tmp_path, kind))
    url = store.write(batch)
    assert url == store.url_for("c1", 0) and store.exists(url)
    back = store.read(url)
    assert back.actor == batch.actor  # exact ids, float64 log-probs, masks, kinds
    assert back.critic == batch.critic  # including a None prediction
    assert back.stats == batch.stats and back.collection_id == "c1" and back.iteration == 0
    assert store.list() == [url] and store.list("c1") == [url]
    # a store pickles (to a worker) and reads the same batch there
    assert pickle.loads(pickle.dumps(store)).read(url).actor == batch.actor


def test_batch_tables_are_queryable_with_duckdb(tmp_path, batch):
    url = BatchStore(tmp_path).write(batch)
    path = url.removeprefix("file://")
    got = duckdb.sql(
        f"select count(*), sum(len(completion_ids)), sum(list_sum(loss_mask)) from read_parquet('{path}/actor/*.parquet')"
    ).fetchall()[0]
    assert got == (len(batch.actor), batch.n_tokens, sum(sum(r.loss_mask) for r in batch.actor))
    meta = json.loads(open(f"{path}/_manifest.json").read())
    assert meta["info"]["summary"]["actor_rows"] == len(batch.actor)


@pytest.mark.parametrize("overlap", [False, True])
def test_large_tables_split_into_parts_and_row_groups_and_come_back_in_order(tmp_path, batch, overlap):
    store = BatchStore(tmp_path, rows_per_file=5, group_tokens=300, overlap=overlap)
    url = store.write(batch)
    folder = url.removeprefix("file://")
    parts = sorted(os.listdir(folder + "/actor"))
    assert len(parts) == math.ceil(len(batch.actor) / 5)
    assert pq.ParquetFile(f"{folder}/actor/{parts[0]}").num_row_groups > 1
    back = store.read(url)
    assert back.actor == batch.actor and back.critic == batch.critic
    # the same batch encodes to the same bytes, with or without encoder threads
    other = BatchStore(tmp_path / "again", rows_per_file=5, group_tokens=300, overlap=not overlap)
    assert other.manifest(other.write(batch)).fingerprint == store.manifest(url).fingerprint


def test_writing_the_same_batch_twice_leaves_one_copy(tmp_path, batch):
    store = BatchStore(tmp_path)
    url = store.write(batch)
    folder = url.removeprefix("file://")
    before = {p: os.stat(os.path.join(dp, p)).st_mtime_ns for dp, _, fs in os.walk(folder) for p in fs}
    rerun = Batch(
        batch.collection_id, batch.iteration, list(batch.actor), list(batch.critic), {**batch.stats, "wall_s": 99.0}
    )
    assert store.write(rerun) == url
    after = {p: os.stat(os.path.join(dp, p)).st_mtime_ns for dp, _, fs in os.walk(folder) for p in fs}
    assert after == before  # nothing rewritten, no second copy
    assert store.read(url).stats["wall_s"] == batch.stats["wall_s"]


def test_a_different_batch_is_refused_unless_overwrite(tmp_path, batch):
    store = BatchStore(tmp_path)
    url = store.write(batch)
    other = Batch("c1", 0, batch.actor[:2], batch.critic[:1], {})
    with pytest.raises(BatchExistsError, match="overwrite=True"):
        store.write(other)
    assert store.read(url).actor == batch.actor  # the finished batch is intact
    store.write(other, overwrite=True)
    assert store.read(url).actor == batch.actor[:2]


def test_half_written_batch_does_not_exist_and_a_rewrite_completes_it(tmp_path, batch, monkeypatch):
    store = BatchStore(tmp_path, rows_per_file=2)
    real_put = Location.put_bytes

    def crash_on_manifest(self, url, data, retry, *, atomic=False):
        if url.endswith("_manifest.json"):
            raise KeyboardInterrupt("killed before the manifest")
        real_put(self, url, data, retry, atomic=atomic)

    monkeypatch.setattr(Location, "put_bytes", crash_on_manifest)
    with pytest.raises(KeyboardInterrupt):
        store.write(batch)
    monkeypatch.setattr(Location, "put_bytes", real_put)
    url = store.url_for("c1", 0)
    with pytest.raises(BatchNotFound, match="without a manifest.*interrupted"):
        store.read(url)
    assert not store.exists(url) and store.list() == []
    # the rerun writes fewer parts: the leftovers of the crashed write are removed
    small = BatchStore(tmp_path, rows_per_file=1000)
    small.write(batch)
    assert os.listdir(url.removeprefix("file://") + "/actor") == ["part-00000.parquet"]
    assert small.read(url).actor == batch.actor


def test_missing_and_corrupt_manifests_are_clear_errors(tmp_path, batch):
    store = BatchStore(tmp_path)
    with pytest.raises(BatchNotFound, match="no batch at .*_manifest.json is missing"):
        store.read(store.url_for("nope", 3))
    url = store.write(batch)
    manifest = url.removeprefix("file://") + "/_manifest.json"
    good = open(manifest, "rb").read()
    open(manifest, "wb").write(good[: len(good) // 2])
    with pytest.raises(ManifestError, match="not valid JSON"):
        store.read(url)
    with pytest.raises(ManifestError, match="overwrite=True"):
        store.write(batch)  # a damaged batch is not silently replaced
    doc = json.loads(good)
    del doc["fingerprint"]
    open(manifest, "w").write(json.dumps(doc))
    with pytest.raises(ManifestError, match="lacks field.*fingerprint"):
        store.read(url)
    store.write(batch, overwrite=True)
    assert store.read(url).actor == batch.actor


def test_truncated_or_missing_data_files_are_detected(tmp_path, batch):
    store = BatchStore(tmp_path)
    url = store.write(batch)
    part = url.removeprefix("file://") + "/actor/part-00000.parquet"
    data = open(part, "rb").read()
    open(part, "wb").write(data[:-100])
    with pytest.raises(CorruptDataError, match="part-00000.parquet.*checksum"):
        store.read(url)
    os.remove(part)
    with pytest.raises(CorruptDataError, match="missing"):
        store.read(url)


def test_schema_mismatch_is_named(tmp_path, batch):
    """A file whose checksum is right but whose columns are wrong (another writer's bug)."""
    store = BatchStore(tmp_path)
    url = store.write(batch)
    folder = url.removeprefix("file://")
    table = pq.read_table(f"{folder}/actor/part-00000.parquet")
    bad = table.set_column(table.schema.get_field_index("advantage"), "advantage", pa.array(["high"] * table.num_rows))
    _replace_part(folder, "actor/part-00000.parquet", bad)
    with pytest.raises(SchemaError, match="'advantage' has type string"):
        store.read(url)
    _replace_part(folder, "actor/part-00000.parquet", table.drop_columns(["loss_mask"]))
    with pytest.raises(SchemaError, match=r"missing \['loss_mask'\]"):
        store.read(url)
    lp = table.column("logprobs").to_pylist()
    lp[1] = lp[1][:-1]
    _replace_part(
        folder,
        "actor/part-00000.parquet",
        table.set_column(11, "logprobs", pa.array(lp, table.schema.field("logprobs").type)),
    )
    with pytest.raises(SchemaError, match="actor row 1 has .* completion ids but .* logprobs entries"):
        store.read(url)


def _replace_part(folder: str, rel: str, table: pa.Table) -> None:
    """Write ``table`` as ``rel`` and fix the manifest's checksum, as a buggy writer would."""
    from storage.manifest import sha256

    pq.write_table(table, f"{folder}/{rel}")
    data = open(f"{folder}/{rel}", "rb").read()
    doc = json.loads(open(f"{folder}/_manifest.json").read())
    for f in doc["files"]:
        if f["path"] == rel:
            f["bytes"], f["sha256"] = len(data), sha256(data)
    open(f"{folder}/_manifest.json", "w").write(json.dumps(doc))


def test_bad_rows_are_rejected_before_anything_is_written(tmp_path, batch):
    store = BatchStore(tmp_path)
    r = batch.actor[0]
    short = ActorRow(**{**r.__dict__, "logprobs": r.logprobs[:-1]})
    with pytest.raises(SchemaError, match=r"actor row 0 has (\d+) completion ids but (?!\1)\d+ logprobs entries"):
        store.write(Batch("c1", 0, [short], [], {}))
    wrong = ActorRow(**{**r.__dict__, "collection_id": "other"})
    with pytest.raises(SchemaError, match="belongs to collection 'other'"):
        store.write(Batch("c1", 0, [wrong], [], {}))
    # a dataset's text iteration: the message said "iteration 0, but the batch is 'c1' iteration 0"
    text = ActorRow(**{**r.__dict__, "collection_id": "c1", "iteration": "0"})
    with pytest.raises(
        SchemaError, match=r"belongs to collection 'c1' iteration '0', but the batch is 'c1' iteration 0$"
    ):
        store.write(Batch("c1", 0, [text], [], {}))
    huge = ActorRow(**{**r.__dict__, "completion_ids": (2**40,), "logprobs": (-1.0,), "loss_mask": (1,)})
    with pytest.raises(SchemaError, match="outside int32"):
        store.write(Batch("c1", 0, [huge], [], {}))
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        store.write(Batch("c1", 0, [], [], {"bad": object()}))
    assert store.list() == [] and not os.path.exists(tmp_path / "batches")


@pytest.mark.parametrize(
    ("table", "change", "says"),
    [
        ("actor", {"advantage": math.nan}, r"actor row 1: column 'advantage' has the value nan, not a finite number"),
        ("actor", {"reward": -math.inf}, r"actor row 1: column 'reward' has the value -inf, not a finite number"),
        ("actor", {"logprobs": "nan"}, r"actor row 1: column 'logprobs' has the value nan, not a finite number"),
        ("critic", {"target": math.inf}, r"critic row 1: column 'target' has the value inf, not a finite number"),
        ("critic", {"weight": math.nan}, r"critic row 1: column 'weight' has the value nan, not a finite number"),
        ("critic", {"prediction": math.nan}, r"critic row 1: column 'prediction' has the value nan, not a finite"),
        ("actor", {"turn_index": 1.5}, r"column 'turn_index' has the value 1.5, not an integer"),
        ("actor", {"edge_id": 2.5}, r"column 'edge_id' has the value 2.5, not an integer"),
        ("critic", {"node_id": math.nan}, r"column 'node_id' has the value nan, not an integer"),
    ],
)
def test_rows_with_values_no_trainer_can_use_are_refused_naming_the_row(tmp_path, batch, table, change, says):
    """A batch made from rows (a user's re-weighted advantages, divided by a spread of 0)
    was written with NaN advantages, rewards, targets or log-probs, read back as they
    were and trained on; a turn index or id of 1.5 was written as 1 (pyarrow truncates a
    float to an integer column), as the doc says of token ids it must not be. Refused
    before anything is written; a collection never makes such a value (each part is
    checked where it gives one)."""
    store = BatchStore(tmp_path)
    rows = list(getattr(batch, table)[:2])
    if change.get("logprobs") == "nan":
        change = {"logprobs": (math.nan,) * len(rows[1].logprobs)}
    rows[1] = dataclasses.replace(rows[1], **change)
    actor, critic = (rows, []) if table == "actor" else ([], rows)
    with pytest.raises(SchemaError, match=says):
        store.write(Batch(batch.collection_id, batch.iteration, actor, critic, {}))
    assert store.list() == []


@pytest.mark.parametrize("iteration", [True, -1, 1.5, "3"])
def test_a_batch_iteration_that_is_no_count_is_refused_naming_it(tmp_path, iteration):
    """``True`` passed the check (a bool is an int) and was written as iteration 1's
    folder, then the table refused it: ``ArrowTypeError: Expected integer, got bool``;
    the weight and checkpoint stores refused a bool already."""
    with pytest.raises(ValueError, match=rf"^iteration must be a non-negative int, got {iteration!r}$"):
        BatchStore(tmp_path).write(Batch("c1", iteration, [], [], {}))
    assert not (tmp_path / "batches").exists()


def test_paths_outside_the_root_are_refused(tmp_path, batch):
    store = BatchStore(tmp_path / "root")
    with pytest.raises(PathOutsideRoot, match="outside the store's root"):
        store.read(f"file://{tmp_path}/elsewhere")
    with pytest.raises(PathOutsideRoot, match="outside"):
        store.read(f"file://{tmp_path}/root/../elsewhere")
    with pytest.raises(PathOutsideRoot, match="outside"):
        store.read("memory://root")
    with pytest.raises(PathOutsideRoot, match="not a valid storage name"):
        store.write(Batch("../escape", 0, [], [], {}))
    with pytest.raises(PathOutsideRoot):
        CheckpointStore(tmp_path).save("c1", "../../x", 0, 1)


def test_retries_are_bounded_and_only_for_transient_errors():
    calls: list[int] = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(104, "reset by peer")
        return "ok"

    slept: list[float] = []
    assert retrying(flaky, "read x", Retry(attempts=3, backoff_s=0.1), sleep=slept.append) == "ok"
    assert slept == [0.1, 0.2]

    def missing():
        calls.append(1)
        raise FileNotFoundError("x")

    calls.clear()
    with pytest.raises(FileNotFoundError):
        retrying(missing, "read x", Retry(attempts=5), sleep=slept.append)
    assert len(calls) == 1

    with pytest.raises(StorageUnavailable, match="read x: storage unreachable after 2 attempt"):
        retrying(lambda: (_ for _ in ()).throw(TimeoutError("slow")), "read x", Retry(attempts=2), sleep=lambda s: None)


def test_a_throttled_or_failing_object_store_is_retried_by_our_policy():
    """s3fs turns SlowDown/503 and 409 into EBUSY, InternalError/500 into EREMOTEIO."""
    import errno

    from storage.urls import is_transient

    assert is_transient(OSError(errno.EBUSY, "SlowDown")) and is_transient(OSError(errno.EREMOTEIO, "500"))
    assert not is_transient(OSError(errno.ENOENT, "missing")) and not is_transient(PermissionError("denied"))


@pytest.mark.integration  # starts a server
def test_s3_makes_one_connection_per_attempt_of_our_retry(monkeypatch):
    """botocore and s3fs make one attempt each (our :func:`retrying` owns the budget): an
    endpoint that drops every connection sees one or two requests per attempt of ours (a
    bucket's ``info`` may ask twice), not botocore's extra retries after random waits of
    up to a second each (12 requests with ``retries.max_attempts = 1``)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    for k, v in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    host, port = srv.getsockname()
    loc = Location("s3://bucket/runs", {"client_kwargs": {"endpoint_url": f"http://{host}:{port}"}})
    try:
        with pytest.raises(StorageUnavailable, match="after 3 attempt"):
            retrying(lambda: loc.fs.info("bucket"), "open bucket", Retry(attempts=3, backoff_s=0.0))
    finally:
        srv.close()
    assert 3 <= len(accepted) <= 6, accepted


# --- checkpoints -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_checkpoint_round_trip_keeps_trees_branch_states_and_directory_workspaces(tmp_path, trees, kind):
    store = CheckpointStore(_root(tmp_path, kind))
    tree = trees[0]
    state = {"trees": trees, "accounting": {"transitions": 7}}
    url = store.save("c1", 1, 0, state)
    assert re.search(r"checkpoints/c1/p001-w00000\.[0-9a-f]{16}\.pkl$", url)
    back = store.load("c1", 1, 0)
    t = back["trees"][0]
    assert t.nodes == tree.nodes and t.edges == tree.edges and back["accounting"] == {"transitions": 7}
    for nid, bs in tree.states.items():
        got = t.states[nid]
        assert isinstance(got, BranchState) and got.context == bs.context and got.env_state == bs.env_state
        assert isinstance(got.workspace, DirectoryWorkspace)
        assert got.workspace.root != bs.workspace.root  # a real copy in a new folder
        assert got.workspace.snapshot() == bs.workspace.snapshot()
    assert any(s.workspace.list() for s in t.states.values())  # the notes survived
    # the restored state continues: same prefix sent, workspace forked from the restored copy
    agent = make_agent()
    cp = next(n for n in t.nodes if n and t.nodes[n].kind == "checkpoint")
    ro = run(agent.rollout(t.states[cp], seed=5))
    assert agent.policy.prompts[0] == t.states[cp].context.prompt_ids
    assert ro.pieces[-1].kind in ("terminal", "truncated")


def test_checkpoint_latest_list_and_idempotent_save(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.latest("c1") is None and store.list("c1") == []
    store.save("c1", 0, 0, {"wave": "evidence"})
    store.save("c1", 1, 0, {"wave": 0})
    store.save("c1", 1, 1, {"wave": 1})
    store.save("c1", "final", 0, "done")
    store.save("c2", 0, 0, "other collection")
    assert store.list("c1") == [(0, 0), (1, 0), (1, 1), ("final", 0)]
    assert store.latest("c1") == ("final", 0) and store.latest("c2") == (0, 0)
    # saving a finished wave again keeps the first copy and changes no order
    store.save("c1", 1, 0, {"wave": "recomputed"})
    assert store.load("c1", 1, 0) == {"wave": 0} and store.latest("c1") == ("final", 0)
    assert [f for f in os.listdir(tmp_path / "checkpoints" / "c1") if f.startswith("p001-w00000.")] == [
        "p001-w00000.manifest.json",
        os.path.basename(store.save("c1", 1, 0, "again")),
    ]
    assert store.exists("c1", 1, 1) and not store.exists("c1", 1, 2)
    shipped = pickle.loads(pickle.dumps(CheckpointStore(tmp_path, retry=Retry(attempts=5))))
    assert shipped.retry.attempts == 5 and shipped.load("c1", 1, 1) == {"wave": 1}


def test_checkpoint_bad_input(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(CheckpointNotFound, match="phase 2 wave 3"):
        store.load("c1", 2, 3)
    url = store.save("c1", 2, 3, list(range(100)))
    path = url.removeprefix("file://")
    os.remove(path.rsplit(".", 2)[0] + ".manifest.json")
    with pytest.raises(CheckpointNotFound, match="interrupted"):
        store.load("c1", 2, 3)  # data without manifest: not a checkpoint
    assert store.latest("c1") is None
    store.save("c1", 2, 3, list(range(100)))
    open(path, "r+b").write(b"\x00\x01")
    with pytest.raises(CorruptDataError, match="checksum"):
        store.load("c1", 2, 3)
    with pytest.raises(TypeError, match="cannot be pickled"):
        store.save("c1", 2, 4, _Unpicklable())
    assert not store.exists("c1", 2, 4)
    with pytest.raises(ValueError, match="wave"):
        store.save("c1", 0, -1, 1)


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("holds a socket")


def test_checkpoint_of_main_classes_and_lambdas_loads_in_another_process(tmp_path):
    """The standard pickler stores classes by reference; a class of ``__main__`` or a
    lambda would not resolve in a resumed process, so those go by value (cloudpickle)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        from dataclasses import dataclass
        from storage import CheckpointStore

        @dataclass
        class Point:
            x: int

        store = CheckpointStore({str(tmp_path)!r})
        store.save("c", "main", 0, {{"p": Point(3), "f": lambda v: v + 1}})
        store.save("c", "plain", 0, {{"trees": list(range(5))}})
        """
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=root, env={**os.environ, "PYTHONPATH": root})
    store = CheckpointStore(tmp_path)
    got = store.load("c", "main", 0)
    assert got["p"].x == 3 and got["f"](1) == 2
    assert store.load("c", "plain", 0) == {"trees": [0, 1, 2, 3, 4]}
    plain = open(store.save("c", "plain", 0, "kept").removeprefix("file://"), "rb").read()  # the saved file
    assert plain == pickle.dumps({"trees": [0, 1, 2, 3, 4]}, protocol=5)  # the standard pickler, byte for byte


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_a_batch_is_staged_outside_batches_until_every_file_is_written(tmp_path, batch, kind, monkeypatch):
    """Every file goes to <root>/_staging/<id>/iter-<n>/ first; the batch folder holds
    nothing before the batch is complete (locally it appears in one rename, manifest
    included), and no staging folder is left afterwards."""
    store = BatchStore(_root(tmp_path, kind), rows_per_file=3)
    url = store.url_for("c1", 0)
    real_put, writes = Location.put_bytes, []

    def watched(self, u, data, retry, *, atomic=False):
        writes.append((u, self.list_files(url, retry)))
        return real_put(self, u, data, retry, atomic=atomic)

    monkeypatch.setattr(Location, "put_bytes", watched)
    store.write(batch)
    monkeypatch.setattr(Location, "put_bytes", real_put)
    staged = [u for u, _ in writes if "/_staging/c1/iter-000000/" in u]
    assert len(staged) >= len(store.encode(batch)) and all(seen == [] for _, seen in writes[: len(staged)])
    assert store.loc.list_files(store.loc.url("_staging"), store.retry) == []
    assert store.read(url).actor == batch.actor
    if kind == "file":
        assert sorted(os.listdir(tmp_path / "store")) == ["batches"]  # no empty staging folders either


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_an_overwrite_or_old_leftovers_leave_only_the_new_batch(tmp_path, batch, kind):
    root = _root(tmp_path, kind)
    store = BatchStore(root, rows_per_file=2)
    url = store.write(batch)
    old = set(store.loc.list_files(url, store.retry))
    other = Batch("c1", 0, batch.actor[:3], batch.critic[:1], {})
    small = BatchStore(root, rows_per_file=1000)
    small.write(other, overwrite=True)
    now = set(store.loc.list_files(url, store.retry))
    assert {u.rsplit("/", 2)[-2] + "/" + u.rsplit("/", 1)[1] for u in now} == {
        "actor/part-00000.parquet",
        "critic/part-00000.parquet",
        "iter-000000/stats.json",
        "iter-000000/_manifest.json",
    }
    assert len(old) > len(now) and small.read(url).actor == other.actor
    # files an older version left in the batch folder without a manifest are replaced
    store.loc.put_bytes(f"{url}/actor/part-00009.parquet", b"half", store.retry)
    store.loc.remove(f"{url}/_manifest.json", store.retry)
    with pytest.raises(BatchNotFound, match=f"without a manifest are in {re.escape(url)}: a write was interrupted"):
        store.read(url)
    small.write(other)
    assert f"{url}/actor/part-00009.parquet" not in store.loc.list_files(url, store.retry)
    assert store.loc.list_files(store.loc.url("_staging"), store.retry) == []


def test_records_name_batches_and_weights_relative_to_the_root(tmp_path):
    """What a record keeps (``ref``) is a path under the root; ``locate`` finds it under
    whatever root the store has now, and finds the batch an older record named by an
    absolute URL of another root (a store moved since)."""
    from storage.weights import WeightStore

    store = BatchStore(tmp_path / "moved")
    url = store.url_for("c1", 3)
    assert store.ref(url) == "batches/c1/iter-000003"
    assert store.locate("batches/c1/iter-000003") == url
    assert store.locate(url) == url
    assert store.locate("file:///old/place/batches/c1/iter-000003") == url
    assert store.locate("s3://bucket/x/batches/c1/iter-000003/") == url
    for bad in ("batches/../../etc", "../batches/c1", "weights/r/v000001", "file:///elsewhere/iter-000003", "batches"):
        with pytest.raises(PathOutsideRoot):
            store.locate(bad)
    weights = WeightStore("memory://w-root")
    folder = weights.folder("run", 2)
    assert weights.ref(f"{folder}/policy.pt") == "weights/run/v000002/policy.pt"
    assert weights.locate("weights/run/v000002/policy.pt") == f"{folder}/policy.pt"
    assert weights.locate("file:///old/weights/run/v000002/policy.pt") == f"{folder}/policy.pt"


def test_parquet_files_lists_a_tables_parts_from_the_manifest(tmp_path, batch):
    store = BatchStore(tmp_path, rows_per_file=4)
    url = store.url_for("c1", 0)
    with pytest.raises(BatchNotFound):
        store.parquet_files(url)
    store.write(batch)
    files = store.parquet_files(url, "actor")
    assert files == [f"{url}/actor/part-{k:05d}.parquet" for k in range(math.ceil(len(batch.actor) / 4))]
    assert duckdb.sql(
        "select count(*) from read_parquet($f)", params={"f": [f.removeprefix("file://") for f in files]}
    ).fetchall()[0][0] == len(batch.actor)
    assert store.parquet_files(url, "critic")[0].endswith("critic/part-00000.parquet")
    with pytest.raises(ValueError, match="'actor' or 'critic'"):
        store.parquet_files(url, "stats")


def test_token_columns_gathered_in_blocks_equal_the_rows(monkeypatch):
    """The list columns are gathered a block of rows at a time (to bound the index
    memory); rows that straddle blocks, empty rows and shared prefixes all come out as
    they went in, at every block size."""
    import focus.batch_columns as columns
    from focus.batch import BatchBuilder

    rng = random.Random(0)
    shared = tuple(rng.randrange(256) for _ in range(7))
    rows = [shared if i % 3 == 0 else tuple(rng.randrange(256) for _ in range(rng.randrange(0, 12))) for i in range(40)]
    for block in (1, 5, 64, 1 << 20):
        monkeypatch.setattr(columns, "_GATHER_BLOCK", block)
        b = BatchBuilder("c", 0)
        for i, prompt in enumerate(rows):
            b.add_turn("t", "t#0", 0, i, 0, "0", "action", prompt, (1, 2), (-0.5, -0.25), 1, 0.0, 0.0, "stop")
        actor, _ = b.tables()
        assert [tuple(p) for p in actor.column("prompt_ids").to_pylist()] == rows, block
        assert actor.column("completion_ids").to_pylist() == [[1, 2]] * len(rows)


def test_a_full_or_read_only_disk_says_how_to_resume():
    """A full disk's line ended `free space or use another root`: another root holds none
    of the collection's saved steps, so the rerun there started it again. Both lines now
    name the copy that keeps them, and the resume."""
    import errno

    from storage.urls import AGAIN, refused

    full = str(refused(OSError(errno.ENOSPC, "No space left on device"), "write /d/x.pkl"))
    assert full == (
        "write /d/x.pkl: no space left on the device (or quota exceeded); free space (or copy the store elsewhere "
        f"and set the storage root there), then {AGAIN}"
    ), full
    read_only = str(refused(OSError(errno.EROFS, "Read-only file system"), "write /d/x.pkl"))
    assert "(or copy the store elsewhere and set the storage root there), then rerun" in read_only, read_only
