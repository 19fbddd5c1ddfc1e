"""A scripted model behind an OpenAI-compatible chat-completions endpoint.

`POST /v1/scripts` keeps a script (`{"steps": [{"calls": [{"id", "tool", "args"}],
"latency_ms"}, {"final": "text"}]}`) under a name derived from its content and answers
`{"model": "script-<digest>"}`; `POST /v1/chat/completions` with that model plays step n, where
n is one more than the assistant turns in the conversation, after the step's latency. A call's
`"arguments"`, when given, is sent as that raw text instead of its `args` (a model that writes
broken JSON). Every request is recorded (with the run, attempt and step its headers name), so
what a model was asked is judged from the model server's own records, never from the engine's
(I5). Like a provider, it reports each answer's `usage` (its tokens, counted by
`simulators/token_limit.py`, in OpenAI's fields; of its prompt tokens, `prompt_tokens_details.
cached_tokens` a prompt-cache hit: what the step's `"cached_tokens"` says, at most the prompt,
0 unsaid) and can be rate limited (`simulators/rate_limit.py`: a 429 with
`Retry-After` past a number of requests or tokens a window).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from simulators import rate_limit, store, token_limit
from simulators.wire import Call, HttpError, Response, _json_object

MAX_LATENCY_MS = 60_000
FINISHED = "The script has no more steps."


def _model_error(status: int, message: str, code: str) -> HttpError:
    """An error in the shape OpenAI-compatible clients read."""
    payload = {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    return HttpError(status, message, payload=payload)


def check_script(script: Any) -> list[dict[str, Any]]:
    """The script's steps, or 400 naming the first thing wrong with it."""
    steps = script.get("steps") if isinstance(script, dict) else None
    if not isinstance(steps, list) or not steps:
        raise HttpError(400, 'a script is an object with a non-empty "steps" list')
    for i, step in enumerate(steps, start=1):
        if not isinstance(step, dict) or ("calls" in step) == ("final" in step):
            raise HttpError(400, f'step {i} needs exactly one of "calls" or "final"')
        latency = step.get("latency_ms", 0)
        if not isinstance(latency, int) or not 0 <= latency <= MAX_LATENCY_MS:
            raise HttpError(400, f'step {i}: "latency_ms" must be 0..{MAX_LATENCY_MS}')
        if "final" in step and not isinstance(step["final"], str):
            raise HttpError(400, f'step {i}: "final" must be text')
        calls = step.get("calls", [])
        if "calls" in step and (not isinstance(calls, list) or not calls):
            raise HttpError(400, f'step {i}: "calls" must be a non-empty list')
        for call in calls:
            if not isinstance(call, dict) or not call.get("id") or not call.get("tool"):
                raise HttpError(400, f'step {i}: each call needs "id" and "tool"')
            if not isinstance(call.get("args", {}), dict):
                raise HttpError(400, f'step {i}: "args" of {call["id"]} must be an object')
            if not isinstance(call.get("arguments", ""), str):
                raise HttpError(400, f'step {i}: "arguments" of {call["id"]} must be text')
        cached = step.get("cached_tokens", 0)
        if not isinstance(cached, int) or isinstance(cached, bool) or cached < 0:
            raise HttpError(400, f'step {i}: "cached_tokens" must be a whole number >= 0')
    return steps


def model_name(script: Any) -> str:
    canonical = json.dumps(script, sort_keys=True, separators=(",", ":"))
    return "script-" + hashlib.sha256(canonical.encode()).hexdigest()[:24]


def save_script(call: Call) -> Response:
    """Keep a script; the same script always gets the same model name."""
    body = _json_object(call.request)
    script = body.get("script", body)
    check_script(script)
    name = model_name(script)
    store.save_model_script(call.conn, name, script)
    return Response(201, {"model": name})


def chat_completions(call: Call) -> Response:
    """Answer one step of a registered script in the chat-completions shape."""
    if not call.request.bearer:
        raise _model_error(401, "missing bearer token", "invalid_api_key")
    limited = rate_limit.refused(call.conn)
    if limited is not None:
        return limited
    body = _json_object(call.request)
    model, messages = body.get("model"), body.get("messages")
    if not isinstance(model, str) or not isinstance(messages, list):
        raise _model_error(400, '"model" (text) and "messages" (a list) are required', "bad")
    script = store.model_script(call.conn, model)
    if script is None:
        raise _model_error(404, f"the model {model} does not exist", "model_not_found")
    steps = check_script(script)
    n = 1 + sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    entry = steps[n - 1] if n <= len(steps) else {"final": FINISHED}
    answer = _completion(model, n, entry)
    message = answer["choices"][0]["message"]
    prompt, completion = token_limit.prompt_tokens(messages), token_limit.completion_tokens(message)
    answer["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": min(int(entry.get("cached_tokens", 0)), prompt),
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    limited = token_limit.refused(call.conn, rate_limit.LIMIT_ID, model, answer["usage"])
    if limited is not None:
        return limited
    return Response(200, answer, delay_ms=int(entry.get("latency_ms", 0)))


def _completion(model: str, step: int, entry: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": entry.get("final")}
    if "calls" in entry:
        message["content"] = entry.get("text")
        message["tool_calls"] = [
            {
                "id": str(c["id"]),
                "type": "function",
                "function": {
                    "name": str(c["tool"]).replace(".", "__"),
                    "arguments": c["arguments"]
                    if "arguments" in c
                    else json.dumps(c.get("args") or {}, sort_keys=True),
                },
            }
            for c in entry["calls"]
        ]
    return {
        "id": f"chatcmpl-{model}-{step}",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if "calls" in entry else "stop",
            }
        ],
    }
