"""The flattened chat format gives exactly the ids of ``tokenizer.apply_chat_template``, for five template families.

Each family's real template string is written here (no downloads) with a small byte-level BPE
tokenizer whose special tokens are that family's markers (Llama-3 and Gemma also get a
post-processor that prepends BOS, the double-BOS trap). The export derives and verifies the
format (``chat_template.chat_format``); the runtime renders and encodes it
(``edge_spec.runtime.chat.encode_chat``); here both are compared with transformers on 30
conversations per family that the export-time verification set does not contain.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from edge_spec.errors import EdgeSpecError, ExportError
from edge_spec.export.chat_template import chat_format
from edge_spec.runtime.chat import encode_chat, fit_chat, render_chat

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501  (the template as Qwen2.5-Instruct ships it)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Llama-3.1-Instruct without its tool branches (not reachable without tools): a system block with the
# knowledge/today dates always comes first, the system message's content inside it.
LLAMA31 = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
    "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# name: (template, special tokens, bos, eos, post-processor prepends BOS, end-of-turn token)
FAMILIES = {
    "smollm2": (SMOLLM2, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_start|>", "<|im_end|>", False,
                "<|im_end|>"),
    "qwen2.5": (QWEN25, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>", False, "<|im_end|>"),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                        "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>", True, "<|eot_id|>"),
    "llama3.1": (LLAMA31, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"], "<|begin_of_text|>", "<|eot_id|>", True, "<|eot_id|>"),
    "gemma2": (GEMMA2, ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", True,
               "<end_of_turn>"),
    "gemma3": (GEMMA3, ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"], "<bos>",
               "<eos>", True, "<end_of_turn>"),
    "phi3": (PHI3, ["<unk>", "<s>", "</s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
             "<s>", "<|endoftext|>", False, "<|end|>"),
}

CORPUS = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n",
          "Paris is the capital of France. Berlin is the capital of Germany.", "Grüße aus Köln, 你好世界 👋",
          "You are a helpful assistant. Answer the question briefly and politely."] * 4

WORDS = ["hello", "Paris", " spaced ", "\n", "  ", "日本語", "🙂", "code:\n    x = 1", "tab\there", "<b>bold</b>",
         "", "What's up?", "trailing \n", "\n\nleading", "Ümlaut", "a" * 40]


def _family(name: str, tmp: Path):
    """(transformers tokenizer loaded from a saved dir, the runtime's tokenizers.Tokenizer of the same file)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    template, specials, bos, eos, bos_post, _ = FAMILIES[name]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=420, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if bos_post:
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B",
                                                          special_tokens=[(bos, tk.token_to_id(bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=bos, eos_token=eos)
    fast.chat_template = template
    out = tmp / name
    fast.save_pretrained(str(out))
    return AutoTokenizer.from_pretrained(str(out)), Tokenizer.from_file(str(out / "tokenizer.json"))


def _conversations(seed: int, n: int) -> list[tuple[list[dict[str, str]], bool]]:
    """Random conversations: optional system, 1..6 turns, ending on the user (+ generation prompt) or the assistant."""
    rnd = random.Random(seed)

    def text() -> str:
        return "".join(rnd.choice(WORDS) for _ in range(rnd.randint(0, 4)))

    out = []
    for i in range(n):
        conv = [{"role": "system", "content": text() or "Be brief."}] if i % 2 else []
        for _ in range(rnd.randint(1, 6)):
            conv += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        end_on_user = i % 3 != 0
        out.append((conv[:-1] if end_on_user else conv, end_on_user))
    return out


def _hf_ids(tok, conv, gen) -> list[int] | None:
    try:
        ids = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=gen, return_dict=False)
    except Exception:
        return None
    return list(ids)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_runtime_ids_equal_apply_chat_template(name: str, tmp_path: Path) -> None:
    tok, runtime_tok = _family(name, tmp_path)
    fmt = chat_format(tok, runtime_tok)
    assert fmt is not None and fmt.verified >= 12
    matched = refused = 0
    for conv, gen in _conversations(seed=len(name), n=44):
        want = _hf_ids(tok, conv, gen)
        if want is None:  # the template refuses it (Gemma-2: no system role): so must the runtime
            with pytest.raises(EdgeSpecError):
                encode_chat(runtime_tok, fmt, conv, gen)
            refused += 1
            continue
        assert encode_chat(runtime_tok, fmt, conv, gen) == want, (name, conv, gen)
        assert render_chat(fmt, conv, gen) == tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
        matched += 1
    assert matched >= 20, (name, matched, refused)
    bos = FAMILIES[name][3 - 1]
    if bos and FAMILIES[name][0].count("bos_token"):  # the template writes BOS: exactly once, first
        ids = encode_chat(runtime_tok, fmt, [{"role": "user", "content": "hi"}])
        assert ids[0] == runtime_tok.token_to_id(bos) and ids.count(ids[0]) == 1


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_format_shape_and_stop_token(name: str, tmp_path: Path) -> None:
    """The table says what the template does: end-of-turn opens the assistant suffix, default system blocks."""
    import json

    from edge_spec.export.tokenizer_check import stop_token_ids

    tok, runtime_tok = _family(name, tmp_path)
    fmt = chat_format(tok, runtime_tok)
    eot = FAMILIES[name][5]
    assert fmt.roles["assistant"][1].startswith(eot)
    tok_json = json.loads((tmp_path / name / "tokenizer.json").read_text())
    assert runtime_tok.token_to_id(eot) in stop_token_ids(tok, tok_json, {}, fmt)
    if name in ("smollm2", "qwen2.5"):  # default system block only when the conversation has none
        assert "system" in fmt.prefixes["^>user"] and "system" not in fmt.prefixes["assistant>user"]
    if name == "gemma3":  # the system message is folded into the first user turn
        assert fmt.prefixes["system>user"] == "" and fmt.trimmed == ("user", "assistant")
    if name == "gemma2":
        assert "system" not in fmt.roles and "user>user" not in fmt.prefixes


def test_smollm2_follow_up_turn_extends_the_previous_prompt(tmp_path: Path) -> None:
    """KV reuse: turn two's ids start with turn one's prompt ids and the reply (the default system block
    is not repeated, BOS is not re-added)."""
    tok, runtime_tok = _family("smollm2", tmp_path)
    fmt = chat_format(tok, runtime_tok)
    one = [{"role": "user", "content": "What is the capital of France?"}]
    first = encode_chat(runtime_tok, fmt, one)
    reply = runtime_tok.encode("The capital of France is Paris.", add_special_tokens=False).ids
    two = one + [{"role": "assistant", "content": "The capital of France is Paris."},
                 {"role": "user", "content": "And of Germany?"}]
    second = encode_chat(runtime_tok, fmt, two)
    assert second[:len(first) + len(reply)] == first + reply
    assert second == _hf_ids(tok, two, True)


@pytest.mark.parametrize("template, needle", [
    # a turn number: the text between two messages depends on their position
    ("{% for m in messages %}{{ loop.index }}. {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
     "{% if add_generation_prompt %}assistant:{% endif %}", "depends on more than those two roles"),
    # Mistral-style: the system prompt moved into the last user message
    ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
     "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
     "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
     "{%- if loop.last and system_message is defined %}{{- '[INST] ' + system_message + '\n\n' + "
     "message['content'] + '[/INST]' }}{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
     "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token}}{%- endif %}"
     "{%- endfor %}", "moves, repeats or drops"),
])
def test_inexpressible_template_is_refused_in_one_sentence(template: str, needle: str, tmp_path: Path) -> None:
    tok, runtime_tok = _family("phi3", tmp_path)
    tok.chat_template = template
    with pytest.raises(ExportError) as err:
        chat_format(tok, runtime_tok)
    msg = str(err.value)
    assert needle in msg and msg.startswith("edge-spec cannot express this model's chat template")
    assert msg.endswith(".") and "\n" not in msg and msg.count("; ") <= 2


def test_fit_chat_drops_oldest_turns_keeps_system() -> None:
    msgs = [{"role": "system", "content": "S"}]
    for i in range(6):
        msgs += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}" * 5}]
    msgs.append({"role": "user", "content": "last"})

    def count(m):
        return sum(len(x["content"]) + 2 for x in m)

    kept, dropped = fit_chat(msgs, count, limit=40)
    assert kept[0]["role"] == "system" and kept[1]["role"] == "user" and kept[-1]["content"] == "last"
    assert count(kept) <= 40 and dropped == len(msgs) - len(kept) and dropped % 2 == 0
    assert fit_chat(msgs, count, limit=10_000) == (msgs, 0)
    with pytest.raises(EdgeSpecError, match="last message"):
        fit_chat(msgs[:1] + [{"role": "user", "content": "x" * 50}], count, limit=20)


def test_legacy_format_renders_as_before(tmp_path: Path) -> None:
    """A manifest written before prefixes existed (verified 0): roles' prefixes, the tokenizer's special tokens."""
    from edge_spec.bundle import ChatFormat

    _, runtime_tok = _family("llama3", tmp_path)
    old = ChatFormat(roles={"user": ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>")},
                     generation_prompt="<|start_header_id|>assistant<|end_header_id|>\n\n")
    conv = [{"role": "user", "content": "hi"}]
    text = render_chat(old, conv)
    assert text == ("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert encode_chat(runtime_tok, old, conv) == runtime_tok.encode(text).ids  # BOS from the post-processor
    assert encode_chat(runtime_tok, old, conv)[0] == runtime_tok.token_to_id("<|begin_of_text|>")
