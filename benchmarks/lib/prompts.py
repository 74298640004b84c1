"""The benchmarks' prompt sets, in one module. Benchmarks take the first N, so a slice measured once stays the same.

* ``CHAT_PROMPTS`` (32), ``ALL_CHAT_PROMPTS`` (96), ``chat_messages`` — held-out chat prompts for benchmarks on real
  chat models (fidelity, speed, acceptance), written for the benchmarks. Checked against every prompt of the committed
  answers files (models/smollm2-data, their decoded prompts) and the built-in distillation prompt set
  (edge_spec/distill/prompts.py): ALL_CHAT_PROMPTS' 33-96 occur in none of them; of the first 32, "What is the capital
  of France?" and "Explain photosynthesis to a ten-year-old." (held out of today's built-in pool,
  prompts.HELD_APART) occur in answers-s1.npz / answers.npz, written before that: the demo head did not train on
  either file, but the demo's n-gram table reads them.
* ``CODE_PROMPTS`` — coding tasks for benchmarks on code models (the coder pair), written for edge-spec, none taken
  from a public benchmark (HumanEval, MBPP and the like are kept for an independent check): write a function, fix a
  bug, explain code, write tests — in Python, JavaScript / TypeScript, Rust, Go, C and SQL.
* ``prompts()`` — the synthetic bench pair's fixed prompts (run_all.py): code completion and chat-shaped (rendered
  like the demo chat template); written for the benchmark, not taken from the training corpus, so no system is
  helped by a memorised continuation; the code prompts still look like the standard library the demo pair was
  trained on.
* ``prompt_ids(bundle, texts)`` — chat prompts rendered and tokenised by a bundle's own chat format.
"""

from __future__ import annotations

from pathlib import Path

CHAT_PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "Explain why the sky is blue in two sentences.",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "What is the difference between a virus and a bacterium?",
    "How do I reverse a list in Python?",
    "Summarise the plot of Romeo and Juliet.",
    "What are the main causes of inflation?",
    "Suggest a name for a small bakery that sells sourdough bread.",
    "How many legs does a spider have, and why?",
    "Translate 'good morning, how are you?' into Spanish.",
    "What should I pack for a weekend hiking trip?",
    "Explain photosynthesis to a ten-year-old.",
    "Write a short email asking my manager for a day off.",
    "What is a prime number? Give two examples.",
    "Why do cats purr?",
    "List the planets of the solar system in order.",
    "How does a refrigerator keep food cold?",
    "What is the Pythagorean theorem?",
    "Give me a simple recipe for pancakes.",
    "What are the benefits of regular exercise?",
    "Describe the water cycle.",
    "Who wrote 'Pride and Prejudice' and what is it about?",
    "How can I improve my public speaking?",
    "What is machine learning, in simple terms?",
    "Write a limerick about a forgetful robot.",
    "Why is it important to drink water?",
    "What is the boiling point of water at sea level?",
    "Explain what a budget is and why it helps.",
    "How do vaccines work?",
    "What are some good habits for studying?",
    "Tell me a fun fact about octopuses.",
)

# 64 more of the same kind, after CHAT_PROMPTS in ALL_CHAT_PROMPTS (benchmarks/distill_acceptance.py --chat --prompts
# 96), so acceptance on chat prompts resolves differences of ~0.01: 32 prompts x 64 tokens give ~1,400 drafts, a
# standard error of ~0.013. The other benchmarks keep the 32 (their numbers stay comparable).
ALL_CHAT_PROMPTS: tuple[str, ...] = CHAT_PROMPTS + (
    "What is the tallest mountain in the world?",
    "How do I make a cup of green tea?",
    "Explain the difference between weather and climate.",
    "Write a two-line poem about the sea.",
    "What does a heart do in the human body?",
    "How do I sort a dictionary by its values in Python?",
    "Which planet is closest to the sun?",
    "Give me three ideas for a rainy afternoon.",
    "Why do leaves change colour in the fall?",
    "What is the difference between a noun and a verb?",
    "How do bees make honey?",
    "Suggest a title for a mystery novel set in a lighthouse.",
    "Why does ice float on water?",
    "How can I save money on groceries?",
    "Explain what an atom is.",
    "Write a thank-you note to a friend who helped me move.",
    "What is the speed of light?",
    "Why do we have seasons?",
    "How do I boil an egg?",
    "What are the three states of matter?",
    "Describe a rainbow to someone who has never seen one.",
    "What is the capital of Japan?",
    "How do plants get water from the soil?",
    "Give me a tip for remembering names.",
    "What is an adjective? Give an example.",
    "How does the internet work, briefly?",
    "Write a short story about a lost umbrella in three sentences.",
    "What is the main ingredient in guacamole?",
    "Why is the ocean salty?",
    "How many continents are there, and what are they?",
    "What is a good way to start learning to play the guitar?",
    "Explain what a computer program is.",
    "What causes thunder?",
    "How can I stay focused while working from home?",
    "What is the difference between a lake and a pond?",
    "Name three animals that live in the Arctic.",
    "How do I write a good cover letter?",
    "What is the purpose of the moon's phases?",
    "Write a riddle about a clock.",
    "What does DNA stand for?",
    "How do airplanes stay in the air?",
    "What are the primary colours?",
    "Give me a simple stretching routine for the morning.",
    "What is the difference between a fruit and a vegetable?",
    "How do I calculate the area of a circle?",
    "Why do we need sleep?",
    "What is the longest river in the world?",
    "Suggest three names for a hiking club.",
    "Explain what recycling is and why it matters.",
    "How do I make a paper airplane?",
    "What is a volcano?",
    "Write a motivational sentence for someone starting a new job.",
    "What are the benefits of reading books?",
    "How does a compass work?",
    "What is the freezing point of water in Fahrenheit?",
    "Explain the rules of tic-tac-toe.",
    "Why do birds migrate?",
    "How can I be a better listener?",
    "What is the difference between 'their', 'there' and 'they're'?",
    "Give me a healthy breakfast idea.",
    "What is an ecosystem?",
    "How many minutes are there in a day?",
    "Write a short poem about a cup of coffee.",
    "What is the role of the lungs?",
)


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """A one-turn conversation, as ``apply_chat_template`` and ``Engine.chat`` take it."""
    return [{"role": "user", "content": prompt}]


CODE_PROMPTS: tuple[str, ...] = (
    "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation.",
    "Write a Python function `chunk(items, size)` that splits a list into consecutive chunks of at most `size` items.",
    "Fix the bug in this Python function:\n\n```python\ndef average(xs):\n    total = 0\n    for x in xs:\n"
    "        total += x\n    return total / len(xs) - 1\n```",
    "Write a JavaScript function that debounces another function by a given number of milliseconds.",
    "Explain what this Python code does:\n\n```python\nfrom collections import Counter\n\ndef top(words, k):\n"
    "    return [w for w, _ in Counter(words).most_common(k)]\n```",
    "Write pytest tests for a Python function `slugify(title)` that lowercases a title and joins its words with "
    "hyphens.",
    "Write a Rust function that returns the n-th Fibonacci number using iteration and u64 arithmetic.",
    "Write a Go function that reverses the words of a sentence.",
    "Write a SQL query that lists the ten customers with the highest total order amount, given tables "
    "customers(id, name) and orders(id, customer_id, amount).",
    "Write a Python class `Stack` with push, pop, peek and is_empty methods.",
    "Fix the bug in this JavaScript code:\n\n```javascript\nfunction sum(arr) {\n  let s = 0;\n"
    "  for (let i = 0; i <= arr.length; i++) {\n    s += arr[i];\n  }\n  return s;\n}\n```",
    "Write a C function that counts the number of set bits in an unsigned 32-bit integer.",
    "Write a Python function that merges two sorted lists into one sorted list without using sort().",
    "Explain the difference between a list and a tuple in Python, with a short code example.",
    "Write a TypeScript interface for a blog post with a title, body, author, tags and a publication date, and a "
    "function that returns the posts with a given tag.",
    "Write a Python function that reads a CSV file and returns the sum of the values in a named column.",
    "Write a Rust function that checks whether a number is prime.",
    "Fix the bug in this Python code:\n\n```python\ndef add_item(item, items=[]):\n    items.append(item)\n"
    "    return items\n```",
    "Write a Python generator that yields the lines of a file that contain a given word.",
    "Write a Go function that computes the SHA-256 hex digest of a string.",
    "Write a Python function that flattens an arbitrarily nested list of integers.",
    "Write unit tests with Jest for a JavaScript function `isLeapYear(year)`.",
    "Explain what this SQL query does:\n\n```sql\nSELECT department, AVG(salary) FROM employees\n"
    "GROUP BY department HAVING COUNT(*) > 5;\n```",
    "Write a Python function that returns the longest common prefix of a list of strings.",
    "Write a C function that reverses a null-terminated string in place.",
    "Write a Python decorator that retries a function up to three times when it raises an exception.",
    "Write a JavaScript function that groups an array of objects by the value of a given key.",
    "Fix the bug in this Rust code:\n\n```rust\nfn largest(v: &Vec<i32>) -> i32 {\n    let mut m = 0;\n"
    "    for x in v { if *x > m { m = *x; } }\n    m\n}\n```",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a Python script that prints the ten most common words in a text file.",
    "Write a Go HTTP handler that returns the current time as JSON.",
    "Write a Python function that validates an IPv4 address given as a string.",
    "Explain what a Python context manager is and write one that times the block it wraps.",
    "Write a binary search function in Python that returns the index of a target in a sorted list, or -1.",
    "Write a TypeScript function that deep-clones a plain object without using JSON.",
    "Write a Python dataclass for a 2D point with a method that returns the distance to another point.",
    "Write a Rust function that counts the words in a string slice.",
    "Fix the bug in this Go code:\n\n```go\nfunc contains(xs []int, x int) bool {\n    for i := 1; i < len(xs); i++ {\n"
    "        if xs[i] == x { return true }\n    }\n    return false\n}\n```",
    "Write a Python function that computes the moving average of a list with a given window size.",
    "Write a C function that computes the greatest common divisor of two integers.",
    "Write a Python function that parses a query string like 'a=1&b=2' into a dictionary.",
    "Write a JavaScript class for a simple event emitter with on, off and emit methods.",
    "Write a Python function that rotates a square matrix 90 degrees clockwise.",
    "Write an SQL statement that creates a table for users with an id, a unique email and a creation timestamp.",
)



BENCH_CODE = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "import os\nimport sys\n\n\ndef walk_files(root, suffix):\n",
    "class LRUCache:\n    \"\"\"A least-recently-used cache of fixed capacity.\"\"\"\n\n"
    "    def __init__(self, capacity):\n",
    "def parse_header(line):\n    \"\"\"Split a 'Key: value' header line.\"\"\"\n    key, sep, value = line.partition(",
)
BENCH_CHAT = (
    "Return the number of items waiting in the queue.",
    "Read a configuration file and return its sections as a dictionary.",
    "Convert a string of hexadecimal digits to bytes.",
    "Remove duplicate entries from a list while keeping their order.",
)


def prompts(quick: bool = False) -> list[tuple[str, str]]:
    """(kind, text) pairs; ``quick`` keeps one of each kind."""
    code = [("code", p) for p in BENCH_CODE]
    from models.corpus import render_chat  # stdlib-only module of the repository

    chat = [("chat", render_chat(p, None)) for p in BENCH_CHAT]
    return [code[0], chat[0]] if quick else code + chat


def prompt_ids(bundle: Path, texts: list[str]) -> list[list[int]]:
    """Chat prompts rendered and tokenised by the bundle's own chat format (what ``Engine.chat`` feeds)."""
    from tokenizers import Tokenizer

    from edge_spec.bundle import read_manifest
    from edge_spec.runtime.chat import encode_chat

    m = read_manifest(bundle)
    tok = Tokenizer.from_file(str(bundle / m.tokenizer.files[0]))
    if m.tokenizer.chat is None:  # a bundle without a chat format: the plain text
        return [list(tok.encode(p).ids) for p in texts]
    return [[int(t) for t in encode_chat(tok, m.tokenizer.chat, chat_messages(p))] for p in texts]
