"""Request and response models of vLLM's OpenAI-compatible API, as the server speaks it.

Field names, types, defaults and the error layout follow vLLM's protocol modules
(``vllm/entrypoints/openai/.../protocol.py``): the embedded server validates requests
with these models, and the tests validate its answers with them. Like vLLM's models
they allow unknown fields (``extra="allow"``), take ``null`` for "use the default" and
check values with the same limits (``max_tokens >= 1`` unless echo-only, ``0 < top_p
<= 1``, ``logprobs`` at most :data:`MAX_LOGPROBS` or -1 for the whole vocabulary,
64-bit seeds). Options this server cannot honour (beam search, penalties, logit bias,
structured output, a suffix) are refused with a 400 naming the field, never ignored.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: vLLM's default ``--max-logprobs``.
MAX_LOGPROBS = 20


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class RequestError(ValueError):
    """A request vLLM would refuse: 400 (or ``status``) naming ``param``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


StopParam = str | list[str] | None
TokenIds = list[Annotated[int, Field(ge=0)]]


class _SamplingFields(OpenAIBaseModel):
    """Sampling fields shared by completions and chat completions (vLLM's extras too)."""

    model: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = 1
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopParam = []
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: int | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    request_id: str | None = None

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def check_sampling(self, max_tokens: int | None, *, allow_zero: bool = False) -> None:
        """vLLM's SamplingParams checks, and refusals of what this server cannot do."""
        if self.n is not None and self.n < 1:
            raise RequestError(f"n must be at least 1, got {self.n}.", "n")
        if self.temperature is not None and self.temperature < 0:
            raise RequestError(f"temperature must be non-negative, got {self.temperature}.", "temperature")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}.", "top_p")
        if self.top_k is not None and self.top_k < -1:
            raise RequestError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.", "top_k")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p}.", "min_p")
        if max_tokens is not None and max_tokens < (0 if allow_zero else 1):
            raise RequestError(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        if self.min_tokens < 0 or (max_tokens is not None and self.min_tokens > max_tokens):
            raise RequestError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}.", "min_tokens")
        if self.stop_token_ids and any(t < 0 for t in self.stop_token_ids):
            raise RequestError("stop_token_ids must be non-negative.", "stop_token_ids")
        if self.prompt_logprobs is not None:
            _check_logprobs(self.prompt_logprobs, "prompt_logprobs")
            if self.stream:
                raise RequestError("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
        if self.stream_options is not None and not self.stream:
            raise RequestError("Stream options can only be defined when `stream=True`.", "stream_options")
        for name, default in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0)):
            value = getattr(self, name)
            if value is not None and value != default:
                raise RequestError(f"{name} is not supported by this server", name)
        if self.logit_bias:
            raise RequestError("logit_bias is not supported by this server", "logit_bias")
        if self.use_beam_search:
            raise RequestError("beam search is not supported by this server", "use_beam_search")


def _check_logprobs(value: int, name: str) -> None:
    if value < -1:
        raise RequestError(f"`{name}` must be a positive value or -1.", name)
    if value > MAX_LOGPROBS:
        raise RequestError(f"Requested {name} of {value}, which is greater than max allowed: {MAX_LOGPROBS}", name)


class CompletionRequest(_SamplingFields):
    prompt: TokenIds | list[TokenIds] | str | list[str] | None = None
    echo: bool | None = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    suffix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_tokens", 16) is None:
            data = {**data, "max_tokens": 16}
        return data

    def check(self) -> None:
        if self.prompt is None or self.prompt == "" or self.prompt == []:
            raise RequestError("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        self.check_sampling(self.max_tokens, allow_zero=bool(self.echo))
        if self.logprobs is not None:
            _check_logprobs(self.logprobs, "logprobs")
        if self.suffix is not None:
            raise RequestError("suffix is not supported by this server", "suffix")


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class Logprob(OpenAIBaseModel):
    """One entry of ``prompt_logprobs`` (vLLM's ``vllm.logprobs.Logprob``)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo


class CompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("cmpl"))
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)


# --- chat -------------------------------------------------------------------------------


class ChatContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessageParam(OpenAIBaseModel):
    role: str
    content: str | list[ChatContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if p.type != "text" or p.text is None:
                raise RequestError(f"content part of type {p.type!r} is not supported (text only)", "messages")
            parts.append(p.text)
        return "\n".join(parts)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessageParam]
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = "none"
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def check(self) -> None:
        if not self.messages:
            raise RequestError("messages must not be empty", "messages")
        self.check_sampling(self.requested_max_tokens())
        if self.top_logprobs is not None:
            _check_logprobs(self.top_logprobs, "top_logprobs")
            if self.top_logprobs > 0 and not self.logprobs:
                raise RequestError("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        if self.tool_choice not in (None, "none"):
            raise RequestError(
                "tool calling is not supported by this server (tool_choice must be 'none')", "tool_choice"
            )
        if self.continue_final_message and self.add_generation_prompt:
            raise RequestError(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                "continue_final_message",
            )


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | None = None
    reasoning: str | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    prompt_token_ids: list[int] | None = None


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseStreamChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: _uid("chatcmpl"))
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: UsageInfo | None = Field(default=None)
    prompt_token_ids: list[int] | None = None


# --- models, tokenizer --------------------------------------------------------------------


class ModelCard(OpenAIBaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: str = "list"
    data: list[ModelCard] = Field(default_factory=list)


class TokenizeRequest(OpenAIBaseModel):
    """vLLM's ``TokenizeCompletionRequest`` or ``TokenizeChatRequest`` (``messages``)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessageParam] | None = None
    add_generation_prompt: bool = True
    add_special_tokens: bool = True
    return_token_strs: bool | None = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise RequestError("send exactly one of 'prompt' or 'messages'", "prompt")


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
