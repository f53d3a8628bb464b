"""Provider Batch APIs and request files: the study's calls at batch prices, any request file through the engine.

- `files`: the request-file format (OpenAI batch JSONL), reading, writing, splitting at limits.
- `providers`: OpenAI-compatible and Gemini-native batch clients behind one interface.
- `store`: the durable record of submitted batches (ids written before they can be lost).
- `runner`: submit, poll with backoff, import into the response cache, re-submit what failed.
- `cost`: tokens and USD per model with the batch discount.
- `study`: `--batch` for the study (rounds of collect -> submit -> import) and the collect pass export uses.
- `requests`: request files through the engine (`requests run`) and results files into the cache (`requests import`).
"""
