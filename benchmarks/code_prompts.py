"""Coding tasks for benchmarks on code models (the coder pair): written for edge-spec, none taken from a public
benchmark (HumanEval, MBPP and the like are kept for an independent check). Write a function, fix a bug, explain
code, write tests — in Python, JavaScript / TypeScript, Rust, Go, C and SQL. Benchmarks take the first N, so a
slice measured once stays the same prompts."""

from __future__ import annotations

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
