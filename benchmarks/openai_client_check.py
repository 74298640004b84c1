"""Logprobs and tool calls through the official ``openai`` client, against a running ``edge-spec serve`` (issue 46).

    edge-spec serve BUNDLE --threads 1 &          # a bundle whose chat template supports tools (Qwen2.5-Coder)
    python benchmarks/openai_client_check.py [--url http://127.0.0.1:8080/v1] [--api-key KEY] [--json out.json]

1. logprobs: a greedy chat request with ``logprobs=True, top_logprobs=5``: every reported token's first
   alternative must be the token itself, and the tokens' bytes must spell the returned text;
2. tools: "What is the weather in Paris?" with a ``get_weather`` tool must come back as a parsed call
   (``finish_reason == "tool_calls"``, name ``get_weather``, arguments naming Paris); then the same
   conversation with that call and the tool's result (a temperature no model would guess), sent with the tools
   and ``tool_choice="none"`` (OpenAI's way to ask for the answer rather than another call), must come back as
   an answer that uses the result (it states the temperature). For the record it also sends that second
   request with ``tool_choice="auto"`` (what many agent loops send) and prints what came back: a small model
   may call the tool again there, which is the model's choice, not a failure of the server.

Prints what the server returned for each step and a JSON summary; exit status 1 when a check fails. Not a
speed benchmark (the times it prints are for orientation only).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from openai import OpenAI

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Berlin"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
RESULT = {"city": "Paris", "temperature_c": 17.3, "sky": "light rain"}  # 17.3: no model guesses it


def check_logprobs(client: OpenAI, model: str, max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=max_tokens, logprobs=True,
                                       top_logprobs=5, messages=[{"role": "user", "content": "Write a Python "
                                                                  "function that reverses a string."}])
    choice = r.choices[0]
    content = choice.logprobs.content if choice.logprobs else []
    top1 = sum(1 for c in content if c.top_logprobs and c.top_logprobs[0].token == c.token)
    spelled = b"".join(bytes(c.bytes) for c in content).decode("utf-8", errors="replace")
    out = {"ok": bool(content) and top1 == len(content) and spelled == choice.message.content,
           "tokens": len(content), "top1_equal": top1, "text_equal": spelled == choice.message.content,
           "completion_tokens": r.usage.completion_tokens, "finish_reason": choice.finish_reason,
           "seconds": round(time.perf_counter() - t0, 1), "text": choice.message.content,
           "first": [{"token": c.token, "logprob": round(c.logprob, 4),
                      "top": [(t.token, round(t.logprob, 3)) for t in c.top_logprobs[:3]]} for c in content[:3]]}
    return out


def check_tools(client: OpenAI, model: str, max_tokens: int) -> dict[str, Any]:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    t0 = time.perf_counter()
    r = client.chat.completions.create(model=model, temperature=0, max_tokens=max_tokens, messages=ask,
                                       tools=[WEATHER])
    choice = r.choices[0]
    calls = choice.message.tool_calls or []
    out: dict[str, Any] = {"first": {"finish_reason": choice.finish_reason, "content": choice.message.content,
                                     "tool_calls": [{"name": c.function.name, "arguments": c.function.arguments}
                                                    for c in calls],
                                     "prompt_tokens": r.usage.prompt_tokens,
                                     "seconds": round(time.perf_counter() - t0, 1)}}
    args = {}
    if calls:
        try:
            args = json.loads(calls[0].function.arguments)
        except json.JSONDecodeError:
            args = {}
    called = choice.finish_reason == "tool_calls" and calls and calls[0].function.name == "get_weather" and \
        "paris" in str(args.get("city", "")).lower()
    out["called"] = bool(called)
    if not called:
        out["ok"] = False
        return out
    history = ask + [{"role": "assistant", "content": choice.message.content, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in calls]}]
    history += [{"role": "tool", "tool_call_id": c.id, "content": json.dumps(RESULT)} for c in calls]
    for key, choice_ in (("second", "none"), ("second_auto", "auto")):
        t0 = time.perf_counter()
        r2 = client.chat.completions.create(model=model, temperature=0, max_tokens=max_tokens, messages=history,
                                            tools=[WEATHER], tool_choice=choice_)
        m2 = r2.choices[0].message
        out[key] = {"tool_choice": choice_, "finish_reason": r2.choices[0].finish_reason, "content": m2.content,
                    "tool_calls": [{"name": c.function.name, "arguments": c.function.arguments}
                                   for c in m2.tool_calls or []],
                    "prompt_tokens": r2.usage.prompt_tokens,
                    "cached_tokens": r2.usage.prompt_tokens_details.cached_tokens,
                    "seconds": round(time.perf_counter() - t0, 1)}
    out["uses_result"] = "17.3" in (out["second"]["content"] or "")
    out["ok"] = out["uses_result"] and out["second"]["finish_reason"] == "stop"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default=None, help="default: the first model the server lists")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per request (a 1-thread coder is slow)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    a = ap.parse_args()
    client = OpenAI(base_url=a.url, api_key=a.api_key, max_retries=0, timeout=a.timeout)
    model = a.model or client.models.list().data[0].id
    summary = {"url": a.url, "model": model, "logprobs": check_logprobs(client, model, a.max_tokens)}
    print(json.dumps({"logprobs": summary["logprobs"]}, indent=2, ensure_ascii=False), flush=True)
    summary["tools"] = check_tools(client, model, a.max_tokens)
    print(json.dumps({"tools": summary["tools"]}, indent=2, ensure_ascii=False), flush=True)
    ok = summary["logprobs"]["ok"] and summary["tools"]["ok"]
    summary["ok"] = ok
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, ensure_ascii=False)
    print(f"logprobs: {'ok' if summary['logprobs']['ok'] else 'FAILED'}; tools: "
          f"{'ok' if summary['tools']['ok'] else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
