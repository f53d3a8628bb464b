"""Infrastructure every stage may use, and that imports nothing of them (the lowest layer).

`errors` (one base class, an exit code and a one-line message per kind), `validation` (a pydantic error as
one line), `tokens` (the one token rule), `money` (the one price rule), `files` (the one atomic write),
`cache_layout` (every folder under the cache root), `redact`, `progress`, `threads`, `aio`.
"""
