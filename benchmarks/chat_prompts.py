"""Held-out chat prompts for benchmarks on real chat models (fidelity, speed, acceptance).

Written for the benchmarks; none of them is in edge-spec's built-in distillation prompt set
(edge_spec/distill/prompts.py), so a drafter is never measured on what it was trained on.
"""

from __future__ import annotations

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


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """A one-turn conversation, as ``apply_chat_template`` and ``Engine.chat`` take it."""
    return [{"role": "user", "content": prompt}]
