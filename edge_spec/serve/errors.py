"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

Every refusal the server makes is an :class:`APIError` raised anywhere in a request's handling
and turned into that body by the app's exception handler, so no request ever sees a traceback.
"""

from __future__ import annotations

from typing import Any

INVALID = "invalid_request_error"


class APIError(Exception):
    """A request the server refuses, with what the OpenAI API would say about it."""

    def __init__(self, status: int, message: str, *, type: str = INVALID, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    """HTTP 400: the request is well-formed HTTP but its JSON asks for something invalid."""
    return APIError(400, message, param=param, code=code)
