"""The coding requests the coder pair's target answers for its n-gram draft table (``prompts.txt``).

    python models/coder-data/prompts.py > models/coder-data/prompts.txt

Languages x problems x phrasings, deterministic. None of the problems is one of the benchmarks' coding tasks
(benchmarks/lib/prompts.py ``CODE_PROMPTS``; a test checks that no prompt here shares a problem with them), and
none comes from a public benchmark (HumanEval, MBPP): drafting is never measured on the text it was built from.
"""

from __future__ import annotations

import itertools

LANGUAGES = ("Python", "JavaScript", "TypeScript", "C", "C++", "Java", "Rust", "Go")
PROBLEMS = (
    "convert a string to title case", "count how often each character occurs in a string",
    "find the second largest number in a list", "check whether two strings are anagrams",
    "compute the sum of the digits of an integer", "convert a decimal number to its binary representation",
    "find all divisors of a positive integer", "remove all whitespace from a string",
    "check whether a list of numbers is sorted", "find the elements two lists have in common",
    "generate all permutations of a short string", "compute the median of a list of numbers",
    "transpose a matrix given as a list of rows", "multiply two matrices", "find the most frequent element of a list",
    "convert snake_case identifiers to camelCase", "compute the dot product of two vectors",
    "clamp a number between a minimum and a maximum", "find the first character of a string that does not repeat",
    "compute the least common multiple of two integers", "implement a queue using two stacks",
    "count the lines of a text file", "pad a string on the left to a given width",
    "check whether the brackets in a string are balanced", "compute the running totals of a list of numbers",
    "find the one missing number in a list holding 1 to n", "split a comma-separated string and trim each field",
    "compute the Hamming distance between two equal-length strings", "implement insertion sort", "implement quicksort",
    "find the longest word in a sentence", "truncate a string to a maximum length, ending it with an ellipsis",
    "compute the Levenshtein edit distance between two strings", "remove the vowels from a string",
    "implement a least-recently-used cache with a fixed capacity", "count the islands in a grid of 0s and 1s",
    "return the unique elements of a list in their original order", "check whether an integer is a perfect square",
    "sum the even numbers of a list", "convert a number of seconds into hours, minutes and seconds",
    "compute the power set of a small set", "rotate the elements of an array left by k positions",
    "check whether a string contains only digits", "find the pair of numbers in a list that adds up to a target",
    "implement a singly linked list with append and print methods", "compute x raised to the power n by squaring",
)
PHRASINGS = (
    "Write a {lang} function to {p}.",
    "Show me how to {p} in {lang}, with a short explanation.",
    "Write {lang} code to {p}, and add a few test cases.",
)


def prompts() -> list[str]:
    return [f.format(lang=lang, p=p) for p, lang, f in itertools.product(PROBLEMS, LANGUAGES, PHRASINGS)]


if __name__ == "__main__":
    print("\n".join(prompts()))
