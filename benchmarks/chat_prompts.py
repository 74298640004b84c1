"""Held-out chat prompts for benchmarks on real chat models (fidelity, speed, acceptance).

Written for the benchmarks. Benchmarks take the first N, so a slice measured once stays the same prompts. Checked
against every prompt of the committed answers files (models/smollm2-data, their decoded prompts) and the built-in
distillation prompt set (edge_spec/distill/prompts.py): ALL_CHAT_PROMPTS' 33-96 occur in none of them; of the
first 32, "What is the capital of France?" and "Explain photosynthesis to a ten-year-old." (held out of today's
built-in pool, prompts.HELD_APART) occur in answers-s1.npz / answers.npz, written before that: the demo head did not
train on either file, but the demo's n-gram table reads them.
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
