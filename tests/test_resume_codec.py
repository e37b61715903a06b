"""A collection is resumed with the env codec it started with: the codec's settings
(``ChatCodec.settings``: ``HFChatCodec``'s template and ``content_special_tokens``) are
kept in the configuration record, and a resume whose factory now builds the codec
otherwise is refused as a configuration change is. The codec comes from the factory's
code, not from the configuration, so no field changed and the resume went ahead: its
new waves rendered env text holding special-token strings into other ids than its old
ones, in one batch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fixtures.journal import StopAfter, Stopped, run_collect
from test_pipeline import small_config
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from focus.format import PolicyFormat
from focus.hf_codec import HFChatCodec
from focus.journal import wave_step
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from tasks.fingerprint import CODEC, CONFIG_KEY, ResumeMismatch, resume_mismatch
from tasks.journal import CheckpointJournal

#: What the factory's codec makes of special-token strings in env text. Nothing in the
#: configuration says it: the test changes it between runs, as an edited factory or a
#: changed library default does.
CONTENT = {"special_tokens": "text"}


def hf_env(tokenizer: str, n_tasks: int, seed: int) -> tuple[Any, PolicyFormat, Any]:
    """The toy task rendered with ``HFChatCodec`` (``env.factory``)."""
    codec = HFChatCodec(tokenizer, content_special_tokens=CONTENT["special_tokens"])  # type: ignore[arg-type]
    return ReachTarget(), PolicyFormat(codec, toy_format().parser), reach_target_tasks(n_tasks, seed=seed)


def tokenizer(folder: Any) -> str:
    """A byte-level BPE tokenizer of 262 ids, within the digit policy's vocabulary (263)."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=262, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["reach the target number", "user assistant system"] * 20, trainer)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_a_resume_whose_codec_renders_env_text_otherwise_is_refused(tmp_path, monkeypatch):
    from flows.preflight import preflight

    env = {"env.kind": "factory", "env.factory": "test_resume_codec:hf_env"}
    cfg = small_config(
        str(tmp_path / "store"), "codec-switch", **env, **{"env.options": {"tokenizer": tokenizer(tmp_path)}}
    )
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 0)))
    assert preflight(cfg).resumed  # its check, before the env is built, has no codec to compare
    record = json.loads(CheckpointJournal(cfg).load(CONFIG_KEY))
    assert record[CODEC]["class"] == "focus.hf_codec.HFChatCodec"
    assert record[CODEC]["content_special_tokens"] == "text" and record[CODEC]["template"]["turn_end"] == "<|im_end|>"

    monkeypatch.setitem(CONTENT, "special_tokens", "control")
    refused = CheckpointJournal(cfg)
    with pytest.raises(ResumeMismatch) as err:
        run_collect(cfg, refused)
    assert str(err.value) == (
        f"collection 'codec-switch' already exists in {cfg.storage.root} with a different configuration (differs "
        "in: codec.content_special_tokens text → control); resume it with the same configuration or use a new "
        "collection id"
    )
    assert [r.kind for r in refused.records] == ["config"]  # nothing replayed
    assert refused.load(("1.continue", 1)) is None

    monkeypatch.setitem(CONTENT, "special_tokens", "text")  # the codec it started with: it resumes
    out = run_collect(cfg, CheckpointJournal(cfg))
    assert out["stats"]["steps_reused"] > 0 and out["stats"]["model_calls"] > 0


def test_the_codec_is_compared_only_where_both_sides_have_it(tmp_path):
    """The preflight compares the configuration before the env is built (no codec on its
    side), and a collection recorded before codecs were has none on the other: neither
    is a difference."""
    cfg = small_config(str(tmp_path / "store"), "codec-old")
    plain = {"seed": 7}
    with_codec = {**plain, CODEC: {"class": "focus.format.ByteCodec"}}
    assert resume_mismatch(cfg, with_codec, plain) is None and resume_mismatch(cfg, plain, with_codec) is None
    other = {**plain, CODEC: {"class": "focus.hf_codec.HFChatCodec"}}
    assert "differs in: codec.class" in str(resume_mismatch(cfg, with_codec, other))


def test_a_codec_setting_the_record_lacks_is_not_compared_and_one_it_has_is(tmp_path):
    """A record saved before ``HFChatCodec`` reported its tokenizer's digest resumes; one
    saved with another digest (another ``tokenizer.json`` at the same path) is refused."""
    import asyncio

    from tasks.fingerprint import CodecRecord, codec_settings

    cfg = small_config(str(tmp_path / "store"), "codec-digest")
    codec = HFChatCodec(tokenizer(tmp_path))
    mine = codec_settings(codec)
    assert set(mine) == {"class", "template", "content_special_tokens", "tokenizer_sha256"}
    record = CodecRecord(cfg)
    record.mine = {"seed": 7}
    record.stored = {"seed": 7, CODEC: {k: v for k, v in mine.items() if k != "tokenizer_sha256"}}
    asyncio.run(record.check(codec, lambda key, value: None))  # an older record: resumes
    record.stored = {"seed": 7, CODEC: {**mine, "tokenizer_sha256": "0" * 64}}
    shown = r"differs in: codec.tokenizer_sha256 0+\.\.\. → " + mine["tokenizer_sha256"][:40]  # long values cut
    with pytest.raises(ResumeMismatch, match=shown):
        asyncio.run(record.check(codec, lambda key, value: None))


def test_checkpoints_of_older_versions_still_name_the_plan_records_where_they_were() -> None:
    """A checkpoint is a standard pickle, which names each class by its module: a wave's
    jobs (``RolloutJob``, ``WavePlan``) lived in ``focus.search.state`` until they moved
    to ``focus.search.jobs``, and a collection saved before must resume after an upgrade."""
    import pickle
    import pickletools

    import focus.search.jobs as jobs
    import focus.search.state as state

    assert state.RolloutJob is jobs.RolloutJob and state.WavePlan is jobs.WavePlan
    old = pickle.dumps(jobs.WavePlan(1, 2), protocol=2)  # protocol 2 names a class in one GLOBAL opcode
    old = old.replace(b"focus.search.jobs\nWavePlan", b"focus.search.state\nWavePlan")
    assert b"focus.search.state" in old and pickle.loads(old) == jobs.WavePlan(1, 2)
    assert any(op.name == "GLOBAL" for op, _, _ in pickletools.genops(old))


def test_another_model_altogether_is_a_configuration_that_differs_not_another_policy(tmp_path):
    """A collection sampled by the embedded model, resumed with a factory's policy (no
    policy version): it was refused as "sampled by policy 3457..., the model service now
    serves None ... or pass --allow-policy-change", hiding what changed (model.kind) and
    offering a flag that cannot resume it. Only other weights alone are PolicyChanged."""
    from tasks.fingerprint import PolicyChanged

    cfg = small_config(str(tmp_path / "store"), "other-model")
    stored = {"seed": 7, "model": {"kind": "local", "policy_version": "3457"}}
    factory = {"seed": 7, "model": {"kind": "factory", "policy_version": None}}
    for allow in (False, True):
        found = resume_mismatch(cfg, stored, factory, allow_policy_change=allow)
        assert type(found) is ResumeMismatch and "differs in: model.kind local → factory" in str(found), found
        assert "serves None" not in str(found)
    other_weights = {"seed": 7, "model": {"kind": "local", "policy_version": "9abc"}}
    assert isinstance(resume_mismatch(cfg, stored, other_weights), PolicyChanged)
    assert resume_mismatch(cfg, stored, other_weights, allow_policy_change=True) is None
