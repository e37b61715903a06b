"""Request and response models of SGLang's native ``/generate`` and weight updates.

They follow SGLang's ``GenerateReqInput`` (``managers/io_struct.py``) and
``SamplingParams`` (``sampling/sampling_params.py``): a single prompt or a batch
(``text`` or ``input_ids``), ``sampling_params`` as one object or one per prompt,
``return_logprob`` with ``logprob_start_len`` (prompt log-probs from that position; -1:
none) and ``top_logprobs_num``. ``sampling_params`` refuses unknown keys, as SGLang's
constructor does; ``null`` means the default; ``max_new_tokens: 0`` scores the prompt
only. Answers carry ``meta_info.weight_version``, the version of the weights that
produced them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from focus.tinylm.protocol import INT64_MAX, INT64_MIN, RequestError


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_defaults(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def check(self) -> None:
        """SGLang's ``SamplingParams.verify``, and refusals of what this server cannot do."""
        if self.temperature < 0:
            raise RequestError(f"temperature must be non-negative, got {self.temperature}.", "temperature")
        if not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}.", "top_p")
        if not 0 <= self.min_p <= 1:
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p}.", "min_p")
        if self.top_k < 1 and self.top_k != -1:
            raise RequestError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.", "top_k")
        if self.max_new_tokens < 0:
            raise RequestError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.", "max_new_tokens")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise RequestError("min_new_tokens must be in [0, max_new_tokens].", "min_new_tokens")
        if self.n < 1:
            raise RequestError(f"n must be at least 1, got {self.n}.", "n")
        for name, default in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0)):
            if getattr(self, name) != default:
                raise RequestError(f"{name} is not supported by this server", name)
        for name in ("json_schema", "regex", "ebnf", "structural_tag", "custom_params", "logit_bias"):
            if getattr(self, name):
                raise RequestError(f"{name} is not supported by this server", name)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class GenerateReqInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    rid: str | list[str] | None = None

    def prompts(self) -> tuple[list[str | list[int]], bool]:
        """The prompts (text or ids) and whether the request is a batch."""
        if (self.text is None) == (self.input_ids is None):
            raise RequestError("Either text or input_ids should be provided.", "input_ids")
        if self.text is not None:
            return ([self.text], False) if isinstance(self.text, str) else (list(self.text), True)
        assert self.input_ids is not None
        if not self.input_ids:
            raise RequestError("input_ids cannot be empty.", "input_ids")
        if isinstance(self.input_ids[0], int):
            return [list(self.input_ids)], False  # type: ignore[arg-type]
        return [list(p) for p in self.input_ids], True  # type: ignore[union-attr]

    def per_prompt(self, name: str, i: int, n: int, default: Any) -> Any:
        value = getattr(self, name)
        if value is None:
            return default
        if isinstance(value, list):
            if len(value) != n:
                raise RequestError(f"'{name}' has {len(value)} entries for {n} prompts", name)
            return value[i] if value[i] is not None else default
        return value


class FinishReason(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str


class MetaInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None
    input_token_logprobs: list[tuple[float | None, int, str | None]] | None = None
    input_top_logprobs: list[list[tuple[float, int, str | None]] | None] | None = None


class GenerateResponse(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str
    output_ids: list[int]
    meta_info: MetaInfo


class UpdateWeightFromDiskReqInput(BaseModel):
    model_config = ConfigDict(extra="allow")

    model_path: str = Field(min_length=1)
    load_format: str | None = None
    abort_all_requests: bool = False
    #: The version to report from now on (SGLang's); default: a hash of the weights file.
    weight_version: str | None = None


class UpdateWeightFromDiskReqOutput(BaseModel):
    model_config = ConfigDict(extra="allow")

    success: bool
    message: str
    num_paused_requests: int = 0
