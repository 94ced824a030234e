"""The local OpenAI-compatible HTTP server: the HTTP layer (http), what a request
must be to get in (guard), parsing requests (requests), the generation engine
(engine) and the response shapes (responses).  No click here: the `serve` command
is commands/serve.py.  May import: api and below.
"""
