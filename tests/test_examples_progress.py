"""Long examples talk: a line on standard error at a fixed interval with what moved, and
a last line when the run ends, so slow can be told from hung (standard output keeps the
result alone)."""

from __future__ import annotations

import io
import threading

import pytest

from examples.common import Progress


def test_progress_prints_a_line_per_interval_with_its_counts_and_a_last_line():
    out = io.StringIO()
    ticked = threading.Event()

    class Watched(io.StringIO):
        def write(self, s: str) -> int:
            n = out.write(s)
            if "model answers" in s:
                ticked.set()
            return n

    with Progress("demo", every_s=0.01, stream=Watched()) as p:
        p.doing = "collecting"
        p.add(**{"model answers": 2, "tokens sampled": 1234})
        assert ticked.wait(10), out.getvalue()  # the interval passed at least once, however loaded the machine
    lines = out.getvalue().splitlines()
    assert any(
        line.startswith("demo: ") and "collecting, 2 model answers, 1,234 tokens sampled" in line for line in lines
    )
    assert lines[-1].startswith("demo: done in ") and lines[-1].endswith("2 model answers, 1,234 tokens sampled")
    assert "collecting" not in lines[-1]


def test_progress_reads_counts_it_polls_and_says_nothing_after_a_failure():
    out = io.StringIO()
    try:
        with Progress("loop", every_s=3600, poll=lambda: {"batches": 3}, stream=out):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert out.getvalue().splitlines() == [out.getvalue().strip()]
    assert (
        out.getvalue().startswith("loop: ")
        and "done" not in out.getvalue()
        and out.getvalue().strip().endswith("3 batches")
    )


@pytest.mark.integration
def test_the_counting_policy_counts_the_answers_sent_together_for_siblings():
    # the OpenAI-compatible client answers the first calls of sibling rollouts in one
    # request (Policy.sample_siblings), which never goes through sample(): the math
    # example's last line said 45 model answers for a batch of 71 transitions
    import asyncio

    from examples.common import CountingPolicy
    from focus.backends import LocalModelServer
    from focus.policy import SamplingParams

    progress = Progress("t", every_s=3600, stream=io.StringIO())
    with LocalModelServer() as server:

        async def go() -> list:
            policy = CountingPolicy(server.url, progress=progress)
            try:
                params = SamplingParams(max_tokens=3, seed=0)
                # the first grouped request is checked once against its last sample alone
                first = await policy.sample_siblings((256, 1, 2), params, [("a",)] * 3)
                assert progress.counts["model answers"] == 4
                return first + await policy.sample_siblings((256, 1, 3), params, [("a",)] * 3)
            finally:
                await policy.aclose()

        answers = asyncio.run(go())
    tokens = sum(len(c.token_ids) for c in answers) + len(answers[2].token_ids)  # the check's answer is the third's
    assert progress.counts == {"model answers": 7, "tokens sampled": tokens}
