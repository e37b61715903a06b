"""The local trainer's update settings (:class:`UpdateConfig`), apart from the trainer.

The pipeline's configuration (``train.local``) is this model, and every ``focus``
command reads the configuration: in :mod:`focus.train_local` it brought in the batch
(pyarrow) and numpy, so ``focus --help`` loaded both (tests/test_imports.py).
:mod:`focus.train_local` re-exports it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class UpdateConfig(BaseModel):
    """Hyper-parameters of one policy update.

    The default is one step along the whole batch's policy gradient, sized by a line
    search to ``target_kl`` (``rule="sgd"``): the update's size is then the same whatever
    the batch's size and advantage scale, and its direction is the gradient's. Adam
    epochs over minibatches (``rule="adam"``) turned the gradient nearly orthogonal and
    landed anywhere from 0.001 to 0.9 KL on the toy (docs/findings/learning.md,
    "Gradient quality"; benchmarks/QUALITY.md, "Learning").

    The pipeline's ``train.local`` section (``tasks.config.TrainConfig``) is this model.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: AdamW learning rate (``rule="adam"``).
    lr: float = Field(1e-3, gt=0.0)
    #: Passes over the batch per update (``rule="adam"``).
    epochs: int = Field(1, ge=1)
    #: Sequences per optimizer step (``rule="adam"``).
    minibatch: int = Field(32, ge=1)
    #: PPO clip range of the importance ratio.
    clip: float = Field(0.2, gt=0.0)
    #: Gradient norm clip (``rule="adam"``).
    max_grad_norm: float = Field(1.0, gt=0.0)
    #: Sampling temperature the batch was collected at; the new log-probs use it too,
    #: so that the ratio compares the same distributions (top-p must be 1). Empty: 1.0,
    #: or in the pipeline the collection's own ``agent.sampling.temperature``.
    temperature: float | None = Field(None, gt=0.0)
    #: Scale advantages to unit standard deviation (their mean is kept: TD advantages
    #: already have a baseline): ``batch`` (true) over the whole batch; ``task`` over
    #: each task's trained tokens (:func:`focus.tree_weights.task_scaled`), as GRPO's
    #: groups are; ``none`` (false) as they come.
    scale_advantages: Literal["batch", "task", "none"] = "batch"
    #: AdamW weight decay (``rule="adam"``).
    weight_decay: float = Field(0.0, ge=0.0)
    #: Torch threads during an update. One leaves the other core of a 2-core machine to
    #: the model server, is the fastest with ``pack="tree"`` (measured: 2 threads took
    #: 4.2x as long in the median; without the trie 2 threads were about 1.7x faster,
    #: benchmarks/README.md, "Local trainer"), and makes the update bit-for-bit reproducible.
    torch_threads: int = Field(1, ge=1)
    #: How sequences share forward passes. ``prefixes``: a sequence that is a prefix of
    #: another rides in it (:func:`focus.packing.pack_prefixes`); ``tree`` (true): that, and every
    #: forward pass laid out as a token trie, each shared token computed once
    #: (:mod:`focus.packing`): the whole batch's under the one-step rules, each
    #: minibatch's under ``adam``, whose minibatches (``minibatch`` prefix-packed
    #: sequences, an optimizer step's data) stay those of ``prefixes``; ``none``
    #: (false): each sequence alone (an ``adam`` minibatch is then ``minibatch``
    #: unpacked sequences). ``tree`` and ``prefixes`` give the same update up to float
    #: rounding.
    pack: Literal["tree", "prefixes", "none"] = "tree"
    #: The update's size in approximate KL(behaviour || policy). ``sgd`` / ``natural``:
    #: the step's length is searched until the whole batch's KL is within 10% of it.
    #: ``adam``: stop once the KL passes it, on a
    #: minibatch before each optimizer step, and on the whole batch after each epoch.
    #: An epoch, the first included, that takes the whole batch's KL past its value
    #: before the update plus twice the target is undone, optimizer state too, and run
    #: again at half the learning rate (which the update keeps), at most
    #: ``focus.kl_bound.MAX_HALVINGS`` times an update; then it is undone and the update ends
    #: (:func:`focus.kl_bound.kl_verdict`). Caps the update size whatever the batch holds: methods
    #: whose batches differ in size and advantage scale then take updates of similar
    #: size, which is what makes their learning curves comparable. Empty (``adam``
    #: only): no stop. 0.1: a step both GRPO and FOCUS batches learned at on every task
    #: of benchmarks/learning.py, where 0.2 learned faster in three updates and stalled
    #: some policies over twelve (docs/findings/learning-steps.md).
    target_kl: float | None = Field(0.1, gt=0.0)
    #: How the loss weights a tree's segments (docs/algorithm.md, "The local
    #: trainer"): ``equal`` (every segment as sampled), ``siblings`` (a segment's
    #: advantage divided by the number of segments that start at its checkpoint) or
    #: ``reach`` (by the product of 1/siblings from the root: the chance a walk that
    #: picks a continuation uniformly at each checkpoint runs through the segment).
    segment_weights: Literal["equal", "siblings", "reach"] = "equal"
    #: ``adam``: the epochs above. ``sgd`` / ``natural``: one step along the batch's
    #: gradient / natural gradient, sized to ``target_kl`` by a line search (needs it;
    #: :mod:`focus.kl_step`; lr, epochs and max_grad_norm unused).
    rule: Literal["adam", "sgd", "natural"] = "sgd"
    #: ``sgd`` / ``natural``: steps per update. 1 (default): one step sized to
    #: ``target_kl``. More: up to that many, each along the gradient at the weights the
    #: one before left and sized to ``target_kl / steps`` of KL from them, ending early
    #: once the whole batch's KL from the behaviour policy reaches ``target_kl``: a path
    #: that follows the gradient as the policy moves. A later step can take back part of
    #: an earlier one, so the update may land below ``target_kl``
    #: (docs/findings/learning-steps.md, "Why more successes did not teach the mapping").
    steps: int = Field(1, ge=1)
    #: ``natural``: conjugate-gradient iterations, and the damping added to the Fisher.
    cg_iterations: int = Field(10, ge=1)
    damping: float = Field(0.1, gt=0.0)
    #: Seeds the minibatch order (with the update index).
    seed: int = 0

    @field_validator("pack", mode="before")
    @classmethod
    def _pack_flag(cls, v: object) -> object:
        return {True: "tree", False: "none"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("scale_advantages", mode="before")
    @classmethod
    def _scale_flag(cls, v: object) -> object:
        return {True: "batch", False: "none"}.get(v, v) if isinstance(v, bool) else v

    @model_validator(mode="after")
    def _sized(self) -> UpdateConfig:
        if self.rule != "adam" and self.target_kl is None:
            raise ValueError(f"rule {self.rule!r} sizes its step to target_kl: set it, or choose rule 'adam'")
        return self
