"""transformers as a peer: ``generate`` on the HF checkpoint, plain or with ``assistant_model`` (assisted
generation, its default dynamic draft-length schedule). :func:`run_worker` runs inside a child process started by
``measure.measure`` (spec ``{"module": "hf", ...}``)."""

from __future__ import annotations

from typing import Any

from edge_spec.runtime.memory import current_rss as rss_bytes

from .measure import run_prompts, summarise


def _hf_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    baseline = rss_bytes()
    dtype = torch.float32
    target = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=dtype).eval()
    draft = None
    if spec.get("draft"):
        draft = AutoModelForCausalLM.from_pretrained(spec["draft"], dtype=dtype).eval()
    after_load = rss_bytes()
    calls = {"target": 0}
    target.register_forward_hook(lambda *a: calls.__setitem__("target", calls["target"] + 1))
    temp = float(spec.get("temperature", 0.0))

    class FirstToken:  # a streamer that only timestamps the first generated token
        def __init__(self, timer) -> None:
            self.timer, self.seen_prompt = timer, False

        def put(self, value) -> None:
            if self.seen_prompt:
                self.timer.first()
            self.seen_prompt = True

        def end(self) -> None:
            pass

    def one(ids: list[int], timer, seed: int):
        torch.manual_seed(seed)
        calls["target"] = 0
        kwargs: dict[str, Any] = {"max_new_tokens": spec["max_new_tokens"], "streamer": FirstToken(timer),
                                  "pad_token_id": target.generation_config.pad_token_id}
        if temp > 0:
            kwargs.update(do_sample=True, temperature=temp, top_k=0, top_p=1.0)
        else:
            kwargs.update(do_sample=False, top_k=None, top_p=None, temperature=None)
        if draft is not None:
            kwargs["assistant_model"] = draft
        with torch.inference_mode():
            out = target.generate(torch.tensor([ids]), **kwargs)
        new = out[0, len(ids):].tolist()
        return new, {"target_calls": calls["target"]}

    timer = run_prompts(spec, one)
    res = {"runs": timer.runs, "rss_baseline": baseline, "rss_after_load": after_load,
           "torch_threads": torch.get_num_threads(), **summarise(timer.runs, spec["repeats"])}
    if draft is not None:
        measured = [r for r in timer.runs if not r["warmup"]]
        # every target call (the first one also prefills the prompt) emits at least one token
        passes = sum(max(1, r["target_calls"]) for r in measured)
        res["tokens_per_target_pass"] = sum(r["tokens"] for r in measured) / passes
        res["assistant"] = {"num_assistant_tokens": draft.generation_config.num_assistant_tokens,
                            "schedule": draft.generation_config.num_assistant_tokens_schedule}
    return res


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    return _hf_worker(spec)
