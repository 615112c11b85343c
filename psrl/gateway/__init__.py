"""The OpenAI-compatible session gateway: agents bring their own loop, psrl keeps the exact tokens.

Pure decision code lives here (chat templates, tool-call parsing, TITO token capture, request
checks, response bodies); the HTTP server (``server``, FastAPI + uvicorn: the ``agents`` extra) and
the session scheduler's wiring (``actors.session``) only move bytes. docs/gateway.md has the rules.
"""

EXTRA_HINT = "the session gateway needs the agents extra: pip install -e '.[agents]'"
