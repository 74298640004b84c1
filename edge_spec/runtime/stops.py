"""Where a generation's text ends, decided token by token: stop strings, and llama-server's two stops for code
completion, ``n_indent`` and ``t_max_predict_ms`` (llama.cpp tools/server, ``process_token``).

A decode step commits one token (plain decoding) or several (speculative). :class:`TextStops` reads a step's
tokens one at a time, so a stop that falls inside a speculative step ends the generation at the token where plain
decoding ends it: the same text, the same tokens (the engine drops the step's later tokens from its context).

``n_indent`` (llama-server's rule, kept exactly): once the text has a line break, every line after it must start
with at least ``n_indent`` spaces or tabs. The first line with anything after fewer (an empty line too: its
line break comes right after no indentation) is cut right after its indentation — the text keeps the line
break and the spaces — and generation ends ("indent"; llama-server's ``stop_type`` "limit"). As in llama-server
the check trails the text: a line is looked at from the token after the one that held the line break before it
(two tokens after, for the first line break), one line per token; so a token or two past the cut may have
been generated (and are counted) before the stop. The first line (the rest of the cursor's line) is never cut.

``t_max_predict_ms``: once that many milliseconds have passed since the first token (a step's tokens share
the time the step ended), the first token whose text has a line break ends generation ("time_limit";
"limit"); nothing is cut. It depends on the clock, so it is the one stop that plain and speculative decoding
may place differently.

Streaming: text is released only when no stop can take it back — a stop string's possible start is held, and
with ``n_indent`` so is each new line until its indentation has been checked (llama-server streams the start of
the line it then cuts; here the streamed pieces always add up to the whole answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from edge_spec.runtime.detok import StreamDetokenizer, find_stop

INDENT = " \t"  # what llama-server counts as indentation


class TextStops:
    """The text of one generation and where it ends (module docstring). ``t_max_predict_ms`` <= 0: no time limit;
    ``clock``: seconds (tests pass a fake)."""

    def __init__(self, detok: StreamDetokenizer, stop: Sequence[str] = (), n_indent: int = 0,
                 t_max_predict_ms: float = 0, clock: Callable[[], float] = time.perf_counter) -> None:
        self.detok, self.stop, self.n_indent = detok, tuple(stop), n_indent
        self.t_max = t_max_predict_ms / 1000 if t_max_predict_ms > 0 else None  # seconds
        self.clock = clock
        self.hold = max((len(s) for s in self.stop), default=1) - 1  # chars that might start a stop string
        self.t_first: float | None = None  # when the first step came (its token ends the prompt's time)
        self.has_new_line = False  # llama-server's slot.has_new_line: a token's text had a line break
        self.line = 0  # llama-server's last_nl_pos: start of the line the indentation check reads (0: none yet)
        self.end: int | None = None  # where a stop string or the indentation cut the text
        self.emitted = 0  # text released so far

    @property
    def text(self) -> str:
        """The generation's text: up to a cut once there is one."""
        return self.detok.text if self.end is None else self.detok.text[:self.end]

    def feed(self, tokens: Sequence[int], finish: str | None = None) -> tuple[int, str | None]:
        """Read one step's committed ``tokens`` in order (``finish``: the step's own end, "stop_token", "length" or
        "context_full", which belongs to its last token). Returns how many of the tokens the generation keeps and
        why it ends there ("stop_string", "indent", "time_limit" or ``finish``; None: it goes on)."""
        now = self.clock()
        self.t_first = now if self.t_first is None else self.t_first
        late = self.t_max is not None and now - self.t_first > self.t_max
        for i, tok in enumerate(tokens):
            why = self._token(self.detok.push([tok]), late)
            if why is not None:
                if i == len(tokens) - 1 and finish == "stop_token" and why != "stop_string":
                    why = finish  # an end-of-generation token outranks llama-server's limits (its text cut stays)
                return i + 1, why
        if finish is None:
            return len(tokens), None
        self.detok.flush()  # the end: release what was held for an incomplete character
        cut = find_stop(self.detok.text, self.stop, max(0, self.emitted - self.hold))
        if cut is not None:
            self.end = cut
            return len(tokens), "stop_string"
        return len(tokens), finish

    def take(self, final: bool = False) -> str:
        """The text no stop can take back any more and not yet taken (``final``: the generation has ended)."""
        text = self.text
        upto = len(text) if final else min(len(text) - self.hold, self._settled(text))
        piece = text[self.emitted:max(self.emitted, upto)]
        self.emitted += len(piece)
        return piece

    # ------------------------------------------------------------------ llama-server's order within a token
    def _token(self, delta: str, late: bool) -> str | None:
        why = None
        cut = find_stop(self.detok.text, self.stop, max(0, self.emitted - self.hold))
        if cut is not None:
            self.end, why = cut, "stop_string"
        cut = self._indent(self.text, pending=self.end is None and self.detok.pending)
        if cut is not None:
            self.end, why = cut, "indent"
        if "\n" in delta:
            self.has_new_line = True
            if late:
                why = why or "time_limit"
        return why

    def _indent(self, text: str, pending: bool) -> int | None:
        """llama-server's indentation check after a token: where to cut ``text`` (None: nowhere). ``pending``: bytes
        of an incomplete character follow the text (llama-server's text holds them, so they count as content)."""
        if not self.has_new_line or self.n_indent <= 0:
            return None
        cut = None
        if self.line > 0:
            pos = self.line
            while pos < len(text) and text[pos] in INDENT:
                pos += 1
            if (pos < len(text) or pending) and pos - self.line < self.n_indent:
                cut = pos
        nl = text.find("\n", self.line)
        if nl >= 0:
            self.line = nl + 1
        return cut

    def _settled(self, text: str) -> int:
        """How much of ``text`` the indentation check can no longer cut."""
        if self.n_indent <= 0:
            return len(text)
        if self.line == 0:  # the first line is never cut; the line after the first break not checked yet
            nl = text.find("\n")
            return len(text) if nl < 0 else nl + 1
        pos = self.line
        while pos < len(text) and text[pos] in INDENT:
            pos += 1
        if pos == len(text) or pos - self.line < self.n_indent:
            return self.line  # the line being checked has no content yet, or will be cut at the next token
        nl = text.find("\n", self.line)  # it passed: final up to its end; the next line is not checked yet
        return len(text) if nl < 0 else nl + 1

