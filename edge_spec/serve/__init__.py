"""``edge-spec serve``: a local OpenAI-compatible HTTP server over one :class:`edge_spec.Engine`.

Needs the ``serve`` extra (``pip install 'edge-spec[serve]'``: Starlette + uvicorn). The lean
runtime never imports this package. Modules: ``requests`` (validation), ``responses`` (bodies),
``infill`` (llama-server's /infill and OpenAI's ``suffix``), ``worker`` (one engine, one thread, a bounded FIFO
queue), ``app`` (the ASGI app), ``run`` (uvicorn, binding, signals).
"""

from edge_spec.serve.app import ServeConfig, create_app

__all__ = ["ServeConfig", "create_app"]
