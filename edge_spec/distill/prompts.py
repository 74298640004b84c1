"""The built-in prompt set the target answers to make a drafter's training text.

FastDraft's lesson: a drafter agrees with its target most on text the target itself wrote, over the
kind of requests the target will serve. For a chat model that is broad: questions, explanations,
code, lists, how-tos, math word problems, writing, follow-ups. The set is generated combinatorially
(topic x task, language x problem, ...) so it is thousands of distinct prompts from a few hundred
lines, and deterministic: the same edge-spec version always yields the same list in the same order.

Prompts are plain user messages; the target's own chat template renders them (data.py).
"""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

from edge_spec.errors import EdgeSpecError

TOPICS = (
    "photosynthesis", "black holes", "the French Revolution", "climate change", "the human heart", "volcanoes",
    "machine learning", "the stock market", "vaccines", "the Roman Empire", "electric cars", "honey bees",
    "the internet", "sleep", "coffee", "the Moon", "democracy", "plate tectonics", "DNA", "inflation",
    "renewable energy", "the immune system", "World War II", "the water cycle", "quantum computing",
    "the Great Wall of China", "social media", "meditation", "recycling", "the Olympic Games", "dinosaurs",
    "gravity", "the printing press", "rainforests", "antibiotics", "blockchain", "the Renaissance", "tides",
    "nutrition", "public speaking", "compound interest", "the solar system", "earthquakes", "languages",
    "music theory", "chess", "bread baking", "gardening", "time management", "the ocean", "cloud computing",
    "ancient Egypt", "the periodic table", "exercise", "friendship", "robots", "the brain", "weather forecasts",
    "space exploration", "bicycles", "photography", "volunteering", "the scientific method", "cryptography",
)

TASKS = (
    "What is {t}?",
    "Explain {t} to a ten-year-old.",
    "Give me three interesting facts about {t}.",
    "Why is {t} important?",
    "Write a short paragraph about {t}.",
    "What are the main advantages and disadvantages of {t}?",
    "Summarize the history of {t} in a few sentences.",
    "List five key terms related to {t} and define each briefly.",
    "What is a common misconception about {t}?",
    "How would you explain {t} in one sentence?",
    "Write a short poem about {t}.",
    "Give me a quiz question about {t} with its answer.",
    "How does {t} affect everyday life?",
    "What should a beginner learn first about {t}?",
    "Compare {t} with something similar and explain the difference.",
    "Write a tweet about {t}.",
    "What are the open questions scientists or experts still have about {t}?",
    "Give me a simple analogy for {t}.",
    "Write an outline for a short essay on {t}.",
    "What careers are related to {t}?",
)

LANGUAGES = ("Python", "JavaScript", "C", "Java", "Rust", "Go", "SQL", "Bash")
CODE_PROBLEMS = (
    "reverse a string", "check whether a number is prime", "compute the factorial of n",
    "find the largest element in a list", "count the words in a sentence", "read a file line by line",
    "sort a list of numbers", "remove duplicates from a list", "compute the Fibonacci sequence",
    "check whether a string is a palindrome", "merge two sorted lists", "convert Celsius to Fahrenheit",
    "find the average of a list of numbers", "implement binary search", "count vowels in a string",
    "swap two variables",
)
CODE_TASKS = (
    "Write a {lang} function to {p}.",
    "How do I {p} in {lang}?",
    "Show me {lang} code that does the following: {p}. Explain it briefly.",
)
CONCEPTS = (
    "a hash map", "recursion", "a linked list", "an API", "object-oriented programming", "a compiler",
    "version control with git", "a database index", "unit testing", "big O notation", "a REST API",
    "garbage collection", "a race condition", "an operating system", "a virtual machine", "encryption",
)
CONCEPT_TASKS = (
    "Explain {c} with an example.", "What is the difference between {c} and a simpler alternative?",
    "When should I use {c}?",
)

HOWTO = (
    "make a cup of tea", "write a good resume", "prepare for a job interview", "learn a new language",
    "save money each month", "start running", "take better notes", "improve my sleep", "plant tomatoes",
    "change a flat tire", "write a thank-you note", "organize my desk", "stay focused while studying",
    "plan a birthday party", "make pancakes", "reduce stress", "give constructive feedback", "back up my phone",
    "start a small business", "learn to draw", "cook rice", "train a puppy", "write a short story",
    "prepare for an exam",
)
HOWTO_TASKS = ("How do I {h}?", "Give me step-by-step instructions to {h}.", "What are some tips to {h}?")

WRITING = (
    "Write an email to my manager asking for a day off.", "Write a short story about a lost key.",
    "Write a haiku about autumn.", "Write a product description for a reusable water bottle.",
    "Write a birthday message for my best friend.", "Write a short speech for a school graduation.",
    "Write a dialogue between a cat and a dog.", "Write a limerick about a programmer.",
    "Write a cover letter opening paragraph for a teaching job.", "Write a recipe for a simple salad.",
    "Write a motivational quote and explain it.", "Write a short review of an imaginary restaurant.",
    "Write a letter to your future self.", "Write a job posting for a junior web developer.",
    "Write an apology message for missing a meeting.", "Write the opening of a mystery novel.",
)

NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro")
ITEMS = ("apples", "books", "pencils", "cookies", "marbles", "stickers")
MATH = (
    "{n} has {a} {i}. {n} buys {b} more and gives away {c}. How many {i} does {n} have now?",
    "{n} reads {a} pages a day. How many pages does {n} read in {b} days?",
    "A box holds {a} {i}. How many boxes are needed for {b} {i}?",
    "{n} had {b} {i} and shared them equally among {c} friends. How many did each friend get, and how many "
    "were left?",
    "What is {a} percent of {b}?",
    "A train travels at {a} km per hour for {c} hours. How far does it go?",
)

FOLLOW_UPS = (
    "Can you give me an example?", "Can you explain that more simply?", "Summarize that in one sentence.",
    "Why is that?", "What are the limitations?", "Can you make it shorter?", "Tell me more.",
    "How would I explain that to a friend?", "What is a good next step?", "Can you give me another one?",
)

SMALL_TALK = (
    "Hello! Who are you?", "What can you help me with?", "Tell me a joke.", "How are you today?",
    "What is the capital of France?", "What is 12 times 7?", "Recommend a good book.",
    "What is the meaning of life?", "Give me a fun fact.", "What day comes after Monday?",
    "Translate 'good morning' into Spanish.", "What is the largest animal on Earth?",
)

# Everyday subjects, asked about the way people ask a chat assistant (added 2026-11-24: drafters trained on the
# first 64 topics accepted ~0.45 of drafts on held-out prompts of that pool but ~0.29 on benchmark chat prompts).
EVERYDAY = (
    "the Eiffel Tower", "Mount Everest", "the Amazon rainforest", "the Sahara desert", "the Pacific Ocean",
    "smartphones", "batteries", "airplanes", "trains", "bridges", "skyscrapers", "lightning", "rainbows", "snow",
    "hurricanes", "magnets", "electricity", "sound", "light", "atoms", "mushrooms", "trees", "birds", "whales",
    "ants", "sharks", "penguins", "elephants", "wolves", "chocolate", "cheese", "tea", "rice", "olive oil",
    "soccer", "basketball", "yoga", "jazz", "the guitar", "painting", "video games", "movies", "podcasts",
    "libraries", "museums", "newspapers", "taxes", "credit cards", "mortgages", "insurance", "elections",
    "the United Nations", "human rights", "pollution", "deserts", "glaciers", "the Amazon river", "caves",
    "the human skeleton", "muscles", "the eyes", "allergies", "the common cold", "vitamins", "sugar", "salt",
    "caffeine", "stress", "happiness", "kindness", "habits", "motivation", "creativity", "memory", "dreams",
)
EVERYDAY_TASKS = (
    "Tell me about {t}.", "What are three surprising things about {t}?", "What is the science behind {t}?",
    "Can you explain {t} simply?", "What is the most important thing to know about {t}?",
    "Write a haiku about {t}.", "Write a limerick about {t}.", "Why do people find {t} interesting?",
    "What are some myths about {t}?", "Give me a short, fun explanation of {t} for a child.",
)
FOODS = (
    "tomato soup", "banana bread", "guacamole", "fried rice", "lemonade", "hummus", "omelette", "apple pie",
    "vegetable curry", "spaghetti bolognese", "French toast", "a smoothie", "chili", "a Greek salad",
    "chocolate chip cookies", "mashed potatoes",
)
FOOD_TASKS = (
    "Give me a simple recipe for {f}.", "What ingredients do I need for {f}?", "How can I make {f} healthier?",
    "What goes well with {f}?",
)
PLACES = (
    "Paris", "Tokyo", "New York", "Rome", "Cairo", "Sydney", "Mexico City", "Iceland", "Kenya", "Peru",
    "Norway", "India", "Vietnam", "Morocco", "Canada", "Scotland",
)
PLACE_TASKS = (
    "What should I see if I visit {p}?", "What is the climate like in {p}?", "Tell me about the food of {p}.",
    "Plan a three-day trip to {p}.", "What is {p} famous for?",
)
PEOPLE = (
    "Albert Einstein", "Marie Curie", "Leonardo da Vinci", "William Shakespeare", "Isaac Newton", "Ada Lovelace",
    "Nelson Mandela", "Frida Kahlo", "Charles Darwin", "Cleopatra", "Mozart", "Galileo",
)
PEOPLE_TASKS = ("Who was {x} and why are they famous?", "What can we learn from {x}?",
                "Give me three facts about {x}.")
PHRASES = ("thank you very much", "where is the train station?", "I would like a coffee, please",
           "what time is it?", "nice to meet you", "I am learning your language")
TARGET_LANGUAGES = ("French", "German", "Italian", "Spanish", "Portuguese")
REQUESTS = (
    "Suggest a name for a coffee shop near a university.", "Suggest three names for a pet goldfish.",
    "Write a short email inviting my team to a lunch on Friday.", "Write a text message to cancel a dinner politely.",
    "What should I pack for a beach holiday?", "What should I bring to a job interview?",
    "Give me five ideas for a rainy weekend.", "Help me write a toast for my sister's wedding.",
    "What are good questions to ask on a first day at work?", "Give me a weekly workout plan for a beginner.",
    "How do I tell a friend I am upset without starting a fight?", "What are some cheap hobbies to try?",
    "Write a two-sentence horror story.", "Describe a sunset to someone who has never seen one.",
    "Give me a riddle and its answer.", "Make a shopping list for a week of healthy meals.",
)

# Self-instruct: the target writes further prompts (its own questions become new user turns).
SELF_INSTRUCT = (
    "Write one question a curious student might ask about {t}. Reply with the question only.",
    "Write one practical question someone might ask an assistant about {t}. Reply with the question only.",
    "Write one instruction a user might give an AI assistant related to {t}. Reply with the instruction only.",
)


# Prompts the benchmarks measure drafters on (benchmarks/lib/prompts.py) are never training prompts.
HELD_APART = frozenset({"What is the capital of France?", "Explain photosynthesis to a ten-year-old."})


def builtin_prompts() -> list[str]:
    """All built-in user messages, deterministic order, no duplicates (a few thousand)."""
    out: list[str] = list(SMALL_TALK) + list(WRITING)
    out += [task.format(t=t) for t, task in itertools.product(TOPICS, TASKS)]
    out += [task.format(lang=lang, p=p) for lang, p, task in itertools.product(LANGUAGES, CODE_PROBLEMS, CODE_TASKS)]
    out += [task.format(c=c) for c, task in itertools.product(CONCEPTS, CONCEPT_TASKS)]
    out += [task.format(h=h) for h, task in itertools.product(HOWTO, HOWTO_TASKS)]
    for i, (tmpl, name, item) in enumerate(itertools.product(MATH, NAMES, ITEMS)):
        a, b, c = 3 + (7 * i) % 40, 12 + (13 * i) % 90, 2 + (5 * i) % 6
        out.append(tmpl.format(n=name, i=item, a=a, b=b, c=c))
    out += list(REQUESTS)
    out += [task.format(t=t) for t, task in itertools.product(EVERYDAY, EVERYDAY_TASKS)]
    out += [task.format(f=f) for f, task in itertools.product(FOODS, FOOD_TASKS)]
    out += [task.format(p=p) for p, task in itertools.product(PLACES, PLACE_TASKS)]
    out += [task.format(x=x) for x, task in itertools.product(PEOPLE, PEOPLE_TASKS)]
    out += [f"Translate '{s}' into {lang}." for s, lang in itertools.product(PHRASES, TARGET_LANGUAGES)]
    return [p for p in dict.fromkeys(out) if p not in HELD_APART]


def self_instruct_requests() -> list[str]:
    """Requests that make the target write new prompts, one per (topic, template)."""
    return [tmpl.format(t=t) for t, tmpl in itertools.product(TOPICS, SELF_INSTRUCT)]


def clean_self_instruct(answer: str) -> str | None:
    """The target's reply to a self-instruct request -> a usable prompt, or None when it is unusable."""
    line = next((ln.strip() for ln in answer.strip().splitlines() if ln.strip()), "")
    line = line.strip('"').removeprefix("Question:").removeprefix("Instruction:").strip()
    if not 12 <= len(line) <= 300:
        return None
    return line


def read_prompt_file(path: Path) -> list[str]:
    """User prompts, one per line (``\\n`` stands for a newline inside a prompt)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeSpecError(f"Cannot read the prompt file '{path}' ({exc.__class__.__name__}); pass a UTF-8 text "
                            "file with one prompt per line.") from None
    prompts = [ln.replace("\\n", "\n").strip() for ln in lines if ln.strip()]
    if not prompts:
        raise EdgeSpecError(f"The prompt file '{path}' has no prompts; put one prompt per line.")
    return prompts


def is_heldout(prompt: str, percent: int) -> bool:
    """Stable held-out split by prompt text (not by position, so adding prompts does not move it)."""
    digest = hashlib.sha256(prompt.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little") % 100 < percent
