"""What the model gateway keeps of an OpenAI-compatible response.

A streamed chat or text completion arrives as server-sent events, one chunk
per token or so; the trajectory wants one completion object, as a
non-streamed call would have returned it. `StreamAssembly` folds the chunks
into that object (content and text concatenated, tool-call deltas merged by
index, log-probs and vLLM's token ids appended). `TokenFacts` reads the
figures RL needs out of a completion object of either kind.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StreamAssembly", "TokenFacts"]

Json = dict[str, Any]


class StreamAssembly:
    """Chunks of one streamed completion in, one completion object out."""

    def __init__(self) -> None:
        self._head: Json = {}
        self._choices: dict[int, Json] = {}
        self._usage: Json | None = None
        self._prompt_token_ids: list[int] | None = None

    def feed(self, chunk: Json) -> None:
        if not self._head:
            self._head = {k: chunk[k] for k in ("id", "model", "created") if k in chunk}
            self._head["object"] = str(chunk.get("object", "")).removesuffix(".chunk")
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        if isinstance(chunk.get("prompt_token_ids"), list):
            self._prompt_token_ids = chunk["prompt_token_ids"]
        for delta in chunk.get("choices") or []:
            if isinstance(delta, dict):
                self._fold(delta)

    def _fold(self, delta: Json) -> None:
        index = int(delta.get("index", 0))
        choice = self._choices.setdefault(index, {"index": index})
        if delta.get("finish_reason") is not None:
            choice["finish_reason"] = delta["finish_reason"]
        if isinstance(delta.get("text"), str):
            choice["text"] = choice.get("text", "") + delta["text"]
        if isinstance(delta.get("token_ids"), list):
            choice.setdefault("token_ids", []).extend(delta["token_ids"])
        if isinstance(delta.get("prompt_token_ids"), list):
            self._prompt_token_ids = delta["prompt_token_ids"]
        if isinstance(delta.get("delta"), dict):
            _fold_message(choice.setdefault("message", {}), delta["delta"])
        if isinstance(delta.get("logprobs"), dict):
            _fold_logprobs(choice.setdefault("logprobs", {}), delta["logprobs"])

    def result(self) -> Json:
        out: Json = {**self._head, "choices": [self._choices[i] for i in sorted(self._choices)]}
        if self._usage is not None:
            out["usage"] = self._usage
        if self._prompt_token_ids is not None:
            out["prompt_token_ids"] = self._prompt_token_ids
        return out


def _fold_message(message: Json, delta: Json) -> None:
    for key in ("role", "refusal"):
        if delta.get(key) is not None:
            message[key] = delta[key]
    for key in ("content", "reasoning_content"):
        if isinstance(delta.get(key), str):
            message[key] = message.get(key, "") + delta[key]
    for call in delta.get("tool_calls") or []:
        _fold_tool_call(message.setdefault("tool_calls", []), call)


def _fold_tool_call(calls: list[Json], delta: Json) -> None:
    """Tool calls stream as deltas by index: the id and name once, the arguments in pieces."""
    index = int(delta.get("index", len(calls)))
    while len(calls) <= index:
        calls.append({"type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    if delta.get("id"):
        call["id"] = delta["id"]
    function = delta.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _fold_logprobs(into: Json, delta: Json) -> None:
    for key, value in delta.items():
        if isinstance(value, list):
            into.setdefault(key, []).extend(value)
        elif value is not None:
            into[key] = value


class TokenFacts:
    """The figures of one completion object that RL trains on."""

    def __init__(self, response: Json) -> None:
        found = response.get("usage")
        usage: Json = found if isinstance(found, dict) else {}
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        self.completion_tokens = int(usage.get("completion_tokens") or 0)
        self.total_tokens = int(usage.get("total_tokens") or 0) or (
            self.prompt_tokens + self.completion_tokens
        )
        choices = response.get("choices") or [{}]
        first = choices[0] if isinstance(choices[0], dict) else {}
        self.prompt_token_ids = _ints(response.get("prompt_token_ids")) or _ints(
            first.get("prompt_token_ids")
        )
        self.completion_token_ids = _ints(first.get("token_ids"))
        self.logprobs = _logprobs(first.get("logprobs"))


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _logprobs(value: Any) -> list[float] | None:
    """Chat: `content[].logprob`; text completions: `token_logprobs`."""
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("content"), list):
        return [float(t.get("logprob", 0.0)) for t in value["content"] if isinstance(t, dict)]
    if isinstance(value.get("token_logprobs"), list):
        return [float(v) for v in value["token_logprobs"] if v is not None]
    return None
