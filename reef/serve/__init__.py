"""serve: the HTTP front door.

The ASGI app (`app.py`), the OpenAI and Anthropic routes and their wire models, Reef's `/reef/*`
routes, the token and body-limit guards, the request path (`inference.py`: admit, freeze the
release, run the runtime, record, hand back a receipt), scenarios and swaps (`scenarios.py`),
and the learners that run beside serving (`learning.py`). See docs/http.md and docs/wire.md.
"""
