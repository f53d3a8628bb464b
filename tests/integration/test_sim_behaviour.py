"""The simulator's replies are the same in every process: Python salts set order per process (`PYTHONHASHSEED`),
and a reply must not depend on it (ties between APIs). The planner's replies to the bundled example's queries,
every API of its registry offered, and to near-identical twins, from three processes salted differently."""

from __future__ import annotations

import json

from helpers import EXAMPLE
from helpers.procs import PYTHON, child_env, run

from evaluator.data import Warnings, find_query_files, load_query_files, load_registry

_SCRIPT = """
import json, sys
from evaluator.study import prompts
from simulator.behaviour import answer
calls = json.loads(sys.stdin.read())
print(json.dumps([answer(prompts.planner_messages(q, apis), seed=0, temperature=0.0) for q, apis in calls]))
"""


def test_replies_are_the_same_in_every_process() -> None:
    w = Warnings()
    reg = load_registry(EXAMPLE, "full", w)
    offered = [(a.display, a.description) for a in reg.apis]
    calls = [(q.text, offered) for q in load_query_files(find_query_files(EXAMPLE), reg, w)]
    # near-identical APIs: equal scores in exact arithmetic, so only a fixed summing order breaks the tie
    twins = [(f"Memory/{verb} observations", "Add or delete observations of entities in the graph")
             for verb in ("add", "delete")]
    calls += [(f"Store observation {i} about Bob in my knowledge graph.", twins) for i in range(20)]
    outs = set()
    for hash_seed in ("1", "2", "3"):
        done = run([PYTHON, "-c", _SCRIPT], input=json.dumps(calls), env=child_env({"PYTHONHASHSEED": hash_seed}),
                   timeout=300)
        assert done.returncode == 0, done.stderr
        outs.add(done.stdout)
    assert len(outs) == 1
