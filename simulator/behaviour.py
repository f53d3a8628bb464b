"""Content generator of the LLM simulator: a heuristic stand-in for a language model, not a model.

`answer` reads the chat messages the evaluator sends and writes what a model plausibly would, using
string heuristics only (clause splitting, keyword lists, token overlap). Its purpose is to exercise
the pipeline end to end (parsing, retrieval, metrics, statistics) offline and fast; numbers produced
with it measure the evaluator, never a language model.

- Discovery prompt: a JSON list of stubs, one per actionable clause of the request, named verb +
  key nouns. Proper nouns are often dropped (the paper's generic "stub hallucination").
- Planner prompt: JSON steps plus the offered APIs whose words overlap the request; sometimes none
  (refusal) or the best weak match (wrong tool) when nothing overlaps, rarely a name not offered.
- hyde prompt: per actionable clause, an imagined registry entry: a "Tool/api" name from the clause's key
  nouns and a one-paragraph description in documentation style ("Returns the ... for the given ...").
- rewrite prompt: {"query": ...}: the request's verbs and key nouns, proper nouns and courtesy dropped.
- Any other prompt that carries a JSON schema (`response_format` json_schema, or json_object with a `schema`,
  llama-cpp-python's form): JSON valid against that schema (`schema_instance`), its strings made from the request
  (a plugin's own structured prompt gets an answer its parser can read, offline).
- Anything else: a short generic reply (a JSON object holding it when json_object is asked without a schema).

Replies are a pure function of (messages, seed, temperature): a `random.Random` seeded from a
blake2b hash of all three drives every choice, so a run is reproducible and runs (seeds) differ the
way repeated samples of a real model do. Real models sometimes wrap JSON in a code fence or prose,
and so does this one, at a small rate, to keep the parser honest.

`reply` is what the server sends: `answer` plus the knobs of real servers and small models (server
flags --p-stray, --p-runaway, --cut-at-max-tokens): answers among stray lists in prose and code,
replies that run away until a token limit cuts them (finish_reason "length"), and bare JSON in the
schema's shape when the request carries `response_format`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence

from evaluator.study.prompts import DISCOVERY_MARKER, HYDE_MARKER, PLANNER_MARKER, REWRITE_MARKER

__all__ = ["answer", "reply"]

# --- rates (per reply or per item); small on purpose: these are imperfections, not the norm ---
_FENCE_RATE = 0.03
_PROSE_RATE = 0.015
_DROP_PROPER_RATE = 0.45  # proper nouns left out of a stub name (generic stubs)
_MERGE_RATE = 0.12  # two adjacent needs folded into one stub (under-decomposition)
_SPLIT_LIST_RATE = 0.25  # "clubs, managers, teammates" becomes one stub per item
_REFUSE_RATE = 0.5  # nothing clears the bar: refuse rather than pick the best weak match
_REFUSE_BLIND_RATE = 0.75  # no word overlaps at all: refuse rather than pick the top-listed API
_ODD_COPY_RATE = 0.08  # a selected name copied with different case/spacing/quoting
_UNOFFERED_RATE = 0.01  # a selected name that was never offered
_STEP_OBJECTS_RATE = 0.03  # steps as {"step", "api"} objects instead of strings
_MAX_STUBS = 5


def _words(text: str) -> list[str]:
    return text.split()


_STOP = frozenset(
    _words(
        """a an the and or but if then so to of for in on at by with about from into over under as is are
    was were be been being am do does did can could would will shall should may might must i me my
    mine we us our you your yours he him his she her it its they them their this that these those
    there here what which who whom whose when where why how all any some each every other another
    such than too very just also only even more most much many few lot lots please kindly thank
    thanks help want wanted need needs needed like love would'd i'm i've i'd let let's make sure get
    know tell give show provide provides fetch find search look retrieve obtain offer share suggest
    recommend interested curious looking eager excited planning going trying able not no yes up out
    one two three well really maybe perhaps something anything things thing stuff way ways info
    information details detail data related regarding particular specific certain different various
    latest current recent new best top good great interesting notable useful available possible id ids
    etc using use used via per including include based order sort type kind has have had made done
        got gets getting com www http https org net today tomorrow tonight yesterday next last"""
    )
)
# Verbs that mark an actionable clause, mapped to the verb a developer would put in a function name.
_VERBS = {
    **dict.fromkeys(_words("get fetch provide give show tell retrieve obtain know display see access pull read watch"), "get"),
    **dict.fromkeys(_words("search find look lookup discover explore browse locate identify"), "search"),
    **dict.fromkeys(_words("suggest recommend propose"), "recommend"),
    **dict.fromkeys(["list"], "list"),
    **dict.fromkeys(_words("check verify validate confirm"), "check"),
    **dict.fromkeys(_words("calculate compute estimate convert"), "calculate"),
    **dict.fromkeys(["translate"], "translate"),
    **dict.fromkeys(_words("generate create make design"), "generate"),
    **dict.fromkeys(_words("send email notify"), "send"),
    **dict.fromkeys(_words("download stream"), "download"),
    **dict.fromkeys(_words("track monitor"), "track"),
    **dict.fromkeys(["compare"], "compare"),
    **dict.fromkeys(_words("analyze analyse evaluate assess"), "analyze"),
    **dict.fromkeys(_words("book reserve"), "book"),
    **dict.fromkeys(["play"], "play"),
    **dict.fromkeys(_words("post publish upload"), "post"),
}
# Phrasing variety across seeds, as a sampled model would show.
_VERB_SYNONYMS = {
    "get": ("get", "get", "fetch", "retrieve"),
    "search": ("search", "search", "find"),
    "recommend": ("recommend", "suggest", "get"),
    "check": ("check", "verify", "validate"),
    "calculate": ("calculate", "compute", "convert"),
    "generate": ("generate", "create"),
    "analyze": ("analyze", "get"),
}
_NEED_CUE_RE = re.compile(
    r"\b(curious about|interested in|looking for|want to know|need to (?:know|find|get)|"
    r"can you|could you|would you|please|help me|i'd like|i would like|what(?:'s| is| are| were)|"
    r"which|how (?:many|much|do|does|can)|where (?:is|are|can)|when (?:is|are|does)|is there|are there)\b",
    re.I,
)
_CHITCHAT_RE = re.compile(r"^(thank|thanks|cheers|hi|hello|hey|i appreciate|appreciate|have a)\b", re.I)
_IDENTITY_RE = re.compile(
    r"^(i'?m|i am|we'?re|we are|i'?ve|i have been|as an?|my \w+ (?:is|are|and)|i (?:love|enjoy|work))\b",
    re.I,
)
_SENTENCE_RE = re.compile(r"(?<=[.?!])\s+|[;\n]+")
# " and " splits only where a new request starts after it; between nouns ("clubs and managers") it
# is one need with a list of objects.
_CLAUSE_RE = re.compile(
    r",?\s+(?:and also|and then|additionally|as well as|plus)\s+|,\s+also,?\s+|"
    r",?\s+and\s+(?=(?:i|we|you|please|then|also|can|could|would|" + "|".join(sorted(_VERBS)) + r")\b)|"
    r"^(?:also|additionally|furthermore|moreover|lastly|finally|then),?\s+",
    re.I,
)
_LEAD_CONNECTOR_RE = re.compile(
    r"^(?:also|additionally|furthermore|moreover|lastly|finally|then|and|plus)\b,?\s*", re.I
)
_OBJ_LEAD_RE = re.compile(r"^(?:me|us)\s+(?:with\s+)?", re.I)
# Where the object of a request ends and its purpose or qualification begins.
_TAIL_RE = re.compile(r"\s(?:to|that|which|who|so|because|since|using|via|as|in order to|for my|for our)\s", re.I)
_QUOTED_RE = re.compile(r"(?<![A-Za-z])['\"\u2018\u201c]([^'\"\u2019\u201d]{1,60})['\"\u2019\u201d](?![A-Za-z])")
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:['\u2019][A-Za-z]+)?|\d[\w.\-]*")
_CAMEL_RE = re.compile(r"([a-z])([A-Z])")
_TOKEN_RE = re.compile(r"[a-z0-9]+")
_GENERIC_REPLIES = (
    "Sure, I can help with that. Could you tell me a bit more about what you need?",
    "Happy to help. What would you like me to do next?",
    "Understood. Let me know which detail you want me to focus on.",
)


def answer(messages: list[dict], *, seed: int, temperature: float) -> str:
    """The simulated model's reply to `messages` (deterministic for messages, seed, temperature)."""
    kind, payload, rng = _compose(messages, seed, temperature)
    return _wrap(payload, rng) if kind else payload


def reply(
    messages: list[dict],
    *,
    seed: int,
    temperature: float,
    max_tokens: int | None = None,
    response_format: dict | None = None,
    p_stray: float = 0.0,
    p_runaway: float = 0.0,
    cut_at_max_tokens: bool = False,
) -> tuple[str, str]:
    """(content, finish_reason) as a server would send them, with the simulator's reply knobs.

    - `response_format` (json_schema or json_object): the bare JSON in the schema's shape (discovery
      wrapped as {"stubs": [...]}), never fenced or in prose, as a grammar-constrained server writes.
    - `p_stray`: the answer sits in prose and code that hold stray lists (`params["origin"]`, a list
      of the offered API names the planner did not pick, `[{"name": "Paris", ...}]`); a strict parser
      reads the same answer as from the clean reply.
    - `p_runaway`: the reply keeps writing list items (a small model's runaway); only a token limit
      ends it.
    - `cut_at_max_tokens`: content beyond `max_tokens` (the simulator's estimate: 4 characters a
      token) is cut and finish_reason is "length".
    With every knob off, the content is `answer(...)`.
    """
    kind, payload, rng = _compose(messages, seed, temperature)
    # Knob draws use their own generator so that turning a knob on leaves the other replies as they were.
    knobs = random.Random(_digest(messages, seed, temperature) ^ 0x5EED)
    structured = isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object")
    knobbed = kind in ("discovery", "planner")  # the knobs model the two prompts of the paper's study
    runaway = knobbed and knobs.random() < p_runaway
    stray = knobbed and not structured and knobs.random() < p_stray
    if runaway and kind is not None:  # runaway implies a kind
        payload = _run_away(kind, payload)
    if structured and kind == "discovery":
        payload = json.dumps({"stubs": json.loads(payload)}, ensure_ascii=False)
    if structured and kind == "hyde":
        payload = json.dumps({"entries": json.loads(payload)}, ensure_ascii=False)
    if structured and kind == "rewrite" and not payload.startswith("{"):
        payload = json.dumps({"query": payload}, ensure_ascii=False)
    if structured and kind is None:  # a prompt the simulator has no heuristic for: the schema's shape
        schema = _schema_of(response_format)
        user = _content(next((m for m in reversed(messages) if m.get("role") == "user"), None))
        value = schema_instance(schema, _request(user), rng) if schema is not None else {"response": payload}
        payload = json.dumps(value, ensure_ascii=False)
    if structured or kind is None:
        text = payload
    elif stray:
        text = _stray(kind, payload, messages, knobs)
    else:
        text = _wrap(payload, rng)
    if cut_at_max_tokens and max_tokens and len(text) > 4 * int(max_tokens):
        return text[: 4 * int(max_tokens)], "length"
    return text, "stop"


def _compose(messages: list[dict], seed: int, temperature: float) -> tuple[str | None, str, random.Random]:
    """(prompt kind or None, undressed reply, the generator positioned for the dressing draw)."""
    rng = random.Random(_digest(messages, seed, temperature))
    # Temperature widens the variety; even at 0 seeds differ, as the study's repeated runs do.
    spread = 1.0 + max(0.0, min(float(temperature), 2.0))
    system = _content(next((m for m in messages if m.get("role") == "system"), None)).lstrip()
    user = _content(next((m for m in reversed(messages) if m.get("role") == "user"), None))
    if system.startswith(DISCOVERY_MARKER):
        return "discovery", _discovery(_request(user), rng, spread), rng
    if system.startswith(PLANNER_MARKER):
        query, apis = _planner_input(user)
        return "planner", _planner(query, apis, rng, spread), rng
    if system.startswith(HYDE_MARKER):
        return "hyde", _hyde(_request(user), rng, spread), rng
    if system.startswith(REWRITE_MARKER):
        return "rewrite", _rewrite(_request(user), rng), rng
    return None, rng.choice(_GENERIC_REPLIES), rng


# ---------------------------------------------------------------------------------------------
# Input handling
# ---------------------------------------------------------------------------------------------


def _digest(messages: list[dict], seed: int, temperature: float) -> int:
    # Python's hash() is salted per process; blake2b keeps replies identical across processes.
    payload = json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)
    h = hashlib.blake2b(f"{seed}|{temperature:.6g}|".encode() + payload.encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


def _content(message: dict | None) -> str:
    if not message:
        return ""
    content = message.get("content")
    if isinstance(content, list):  # OpenAI multi-part content
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _request(user: str) -> str:
    _, sep, rest = user.partition("User request:")
    text = rest if sep else user
    return text.split("\n\nAvailable APIs:", 1)[0].strip()


def _planner_input(user: str) -> tuple[str, list[tuple[str, str]]]:
    """(query, [(display name, description)]) from the planner's user message."""
    query = _request(user)
    _, _, listing = user.partition("Available APIs:")
    apis: list[tuple[str, str]] = []
    for line in listing.splitlines():
        if line.startswith("- ") and ("/" in line or ": " in line):
            apis.append(_split_api_line(line[2:]))
        elif apis and line.strip():
            # descriptions may span lines; the continuation belongs to the previous API
            name, desc = apis[-1]
            apis[-1] = (name, f"{desc} {line.strip()}")
    return query, apis


def _split_api_line(body: str) -> tuple[str, str]:
    # The name ends at the first ": " after the tool/api slash; a tool name may itself hold ": ",
    # an api name rarely does, and a model reading the list would make the same guess. A name without a
    # slash (a corpus document shown by its id) ends at the first ": ": a slash further on is the
    # description's, which reads as prose, not as a name.
    first = body.find(": ")
    slash = body.find("/")
    cut = body.find(": ", slash) if slash >= 0 else first
    if 0 <= first < slash and (cut < 0 or _prose(body[first + 2 : cut])):
        cut = first
    if cut < 0:
        name = body.rstrip()
        return (name[:-1] if name.endswith(":") else name), ""
    return body[:cut], body[cut + 2 :].strip()


def _prose(text: str) -> bool:
    """Text that reads as a sentence rather than a tool name: long, or broken by a sentence end."""
    return len(text) > 200 or any(p in text for p in (". ", "? ", "! "))


# ---------------------------------------------------------------------------------------------
# Clauses
# ---------------------------------------------------------------------------------------------


class _Clause:
    __slots__ = ("text", "verb", "obj", "nouns", "proper", "actionable")

    def __init__(
        self, text: str, verb: str | None, obj: str, nouns: list[str], proper: set[str], actionable: bool
    ) -> None:
        self.text = text  # the clause as written
        self.verb = verb  # canonical verb, None when the clause has no action verb
        self.obj = obj  # what the verb acts on, without purpose tails ("to compare it ...")
        self.nouns = nouns  # content words of obj, in order, lower-case
        self.proper = proper  # those of nouns that were capitalised mid-clause
        self.actionable = actionable


def _verb_of(word: str) -> str | None:
    # A tiny lemmatiser: "retrieving", "fetched", "finds" name the same action.
    if word in _VERBS:
        return _VERBS[word]
    for stem in (word[:-3], word[:-3] + "e", word[:-2], word[:-2] + "e", word[:-1]):
        if len(stem) > 2 and stem in _VERBS and word.endswith(("ing", "ed", "es", "s")):
            return _VERBS[stem]
    return None


def _split_clauses(query: str) -> list[str]:
    out: list[str] = []
    for sentence in _SENTENCE_RE.split(query):
        for part in _CLAUSE_RE.split(sentence):
            part = _LEAD_CONNECTOR_RE.sub("", part.strip(" ,.;:!?\t"))
            if part:
                out.append(part)
    return out


def _analyse(text: str) -> _Clause:
    # Quoted literals ('gmhikaru', 'B08N5WG761') are arguments, never part of a function name.
    # Blanking them to equal length keeps offsets valid in the original text, which steps quote.
    bare = _QUOTED_RE.sub(lambda m: " " * len(m.group()), text)
    verb: str | None = None
    start = 0
    for m in _WORD_RE.finditer(bare):
        verb = _verb_of(m.group().lower())
        if verb:
            start = m.end()
            break
    if verb is None:
        cue = _NEED_CUE_RE.search(bare)
        start = cue.end() if cue else 0
    tail = _TAIL_RE.search(bare, start)
    end = tail.start() if tail else len(bare)
    nouns, proper = _nouns(bare[start:end], offset=start)
    if not nouns and tail:
        end = len(bare)
        nouns, proper = _nouns(bare[start:end], offset=start)
    obj = _OBJ_LEAD_RE.sub("", " ".join(text[start:end].split()))
    lowered = text.lower()
    if _CHITCHAT_RE.match(lowered):
        actionable = False
    elif _IDENTITY_RE.match(lowered) and verb is None:
        actionable = bool(_NEED_CUE_RE.search(lowered))
    else:
        actionable = verb is not None or bool(_NEED_CUE_RE.search(lowered))
    return _Clause(text, verb, obj, nouns, proper, actionable and bool(nouns))


def _nouns(text: str, offset: int) -> tuple[list[str], set[str]]:
    nouns: list[str] = []
    proper: set[str] = set()
    for m in _WORD_RE.finditer(text):
        w = m.group().replace("\u2019", "'")
        if w.lower().endswith("'s"):
            w = w[:-2]
        low = w.lower()
        if low in _STOP or len(low) < 2 or "'" in low or any(ch.isdigit() for ch in low):
            continue
        # "retrieving", "fetched" are the action, but "posts", "email" and "books" are things
        if low.endswith(("ing", "ed")) and _verb_of(low):
            continue
        if low not in nouns:
            nouns.append(low)
        # capitalised mid-sentence = a name (Messi, Vimeo); short all-caps words are acronyms (NAV, ZIP)
        if offset + m.start() > 0 and w[0].isupper() and not (w.isupper() and len(w) <= 4):
            proper.add(low)
    return nouns, proper


def _needs(query: str) -> list[_Clause]:
    """The actionable clauses of a request, verbless list tails inheriting the previous verb."""
    clauses: list[_Clause] = []
    prev: _Clause | None = None
    for text in _split_clauses(query):
        c = _analyse(text)
        # "... clubs, managers, teammates, and referees": the tail after "and" is the same request
        if (
            not c.actionable
            and c.verb is None
            and c.nouns
            and prev is not None
            and prev.actionable
            and not _IDENTITY_RE.match(text.lower())
            and not _CHITCHAT_RE.match(text.lower())
            and len(text.split()) <= 6
        ):
            c.verb, c.actionable = prev.verb, True
        if c.actionable:
            clauses.append(c)
        prev = c
    if not clauses:
        # nothing reads as a request: a model still names one function for the gist of it
        best = max((_analyse(t) for t in _split_clauses(query) or [query]), key=lambda c: len(c.nouns))
        if best.nouns:
            best.actionable = True
            clauses.append(best)
    return clauses


# ---------------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------------


def _stub_name(verb: str | None, nouns: Sequence[str], proper: set[str], rng: random.Random, spread: float) -> str:
    kept: list[str] = []
    for n in nouns:
        # "movies" and "movie" are one word to a developer naming a function
        if (n not in proper or rng.random() > _DROP_PROPER_RATE * spread) and all(_stem(k) != _stem(n) for k in kept):
            kept.append(n)
    if not kept:
        kept = [n for n in nouns if n not in proper] or list(nouns[:1])
    width = rng.choice((1, 2, 2, 2, 3))
    # The first nouns of an object are usually what is asked for; the last ones sometimes are
    # ("weather forecast for Paris" vs "latest crypto symbols"), so a model's choice varies.
    picked = kept[:width] if rng.random() < 0.6 else kept[-width:]
    base = verb or "get"
    verb_word = rng.choice(_VERB_SYNONYMS[base]) if base in _VERB_SYNONYMS and rng.random() < 0.35 * spread else base
    name = "_".join([verb_word, *picked])
    return re.sub(r"[^a-z0-9_]+", "", name.lower()).strip("_") or "get_information"


def _reasoning(text: str, rng: random.Random) -> str:
    text = text.strip(" ,;")
    text = text[0].upper() + text[1:] if text else text
    if not text.endswith((".", "?", "!")):
        text += "."
    if rng.random() < 0.2:
        return f"Serves the part of the request: {text}"
    return text


def _discovery(query: str, rng: random.Random, spread: float) -> str:
    needs = _needs(query)
    stubs: list[dict[str, str]] = []
    i = 0
    while i < len(needs) and len(stubs) < _MAX_STUBS:
        c = needs[i]
        if i + 1 < len(needs) and rng.random() < _MERGE_RATE * spread:
            nxt = needs[i + 1]
            merged = c.nouns[-1:] + nxt.nouns[-1:]
            name = _stub_name(c.verb, merged, c.proper | nxt.proper, rng, spread)
            joined = f"{c.text} and {nxt.text[:1].lower()}{nxt.text[1:]}"
            stubs.append({"name": name, "reasoning": _reasoning(joined, rng)})
            i += 2
            continue
        content = [n for n in c.nouns if n not in c.proper]
        names = [n for n in c.nouns if n in c.proper][:1]
        if "," in c.obj and len(content) >= 3 and rng.random() < _SPLIT_LIST_RATE * spread:
            for noun in content[: _MAX_STUBS - len(stubs)]:
                name = _stub_name(c.verb, [*names, noun], c.proper, rng, spread)
                stubs.append({"name": name, "reasoning": _reasoning(c.text, rng)})
        else:
            stubs.append({"name": _stub_name(c.verb, c.nouns, c.proper, rng, spread), "reasoning": _reasoning(c.text, rng)})
        i += 1
    if not stubs:
        stubs.append({"name": "get_information", "reasoning": _reasoning(query[:200] or "Answer the request", rng)})
    seen: set[str] = set()
    unique = []
    for s in stubs:  # the first stub of each name, in order
        if s["name"] not in seen:
            seen.add(s["name"])
            unique.append(s)
    return json.dumps(unique, ensure_ascii=False, indent=rng.choice((None, 2)))


# ---------------------------------------------------------------------------------------------
# hyde and rewrite
# ---------------------------------------------------------------------------------------------

_DOC_OPENINGS = ("Returns", "Retrieves", "Provides", "Lists")


def _hyde(query: str, rng: random.Random, spread: float) -> str:
    """Per actionable clause, the registry entry an API serving it might have: a "Tool/api" name and a short
    description in documentation words. Proper nouns are kept less often than a stub drops them: a document
    describes what an API does, not the user's case."""
    entries: list[dict[str, str]] = []
    for c in _needs(query)[:_MAX_STUBS]:
        content = [n for n in c.nouns if n not in c.proper] or list(c.nouns[:1])
        if not content:
            continue
        width = rng.choice((1, 2, 2, 3))
        picked = content[:width] if rng.random() < 0.6 else content[-width:]
        tool = " ".join(w.title() for w in picked[:2])
        verb = c.verb or "get"
        api = f"{verb} {' '.join(picked)}"
        opening = rng.choice(_DOC_OPENINGS) if rng.random() < 0.5 * spread else "Returns"
        rest = [n for n in content if n not in picked][:4]
        extra = f", with {', '.join(rest)}" if rest else ""
        desc = f"{opening} the {' '.join(picked)} for the given parameters{extra}. Use it to {verb} {c.obj.strip(' ,.')[:120]}."
        entries.append({"name": f"{tool}/{api}", "description": desc})
    if not entries:
        entries.append({"name": "Information/get information", "description": "Returns information for a request."})
    return json.dumps(entries, ensure_ascii=False, indent=rng.choice((None, 2)))


def _rewrite(query: str, rng: random.Random) -> str:
    """One search query: each clause's verb and its content nouns (proper nouns dropped), in request order."""
    words: list[str] = []
    for c in _needs(query):
        for w in [c.verb or "get", *[n for n in c.nouns if n not in c.proper]]:
            if w not in words:
                words.append(w)
    text = " ".join(words[:16]) or " ".join(_words(query)[:12])
    return json.dumps({"query": text}, ensure_ascii=False) if rng.random() >= 0.02 else text


# ---------------------------------------------------------------------------------------------
# Planner
# ---------------------------------------------------------------------------------------------


def _stem(token: str) -> str:
    if len(token) > 4 and token.endswith("ies"):
        return token[:-3] + "y"
    if len(token) > 5 and token.endswith("ing"):
        return token[:-3]
    if len(token) > 3 and token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


def _tokens(text: str) -> set[str]:
    words = _TOKEN_RE.findall(_CAMEL_RE.sub(r"\1 \2", text).lower())
    return {_stem(w) for w in words if len(w) > 1 and w not in _STOP or w in _VERBS}


def _scores(query: str, apis: Sequence[tuple[str, str]]) -> list[float]:
    q = _tokens(query)
    fields: list[tuple[set[str], set[str], set[str]]] = []
    df: dict[str, int] = {}
    for name, desc in apis:
        tool, _, api = name.partition("/") if "/" in name else ("", "", name)  # a document: its id alone
        f = (_tokens(api), _tokens(tool), _tokens(" ".join(desc.split()[:40])))
        fields.append(f)
        for t in f[0] | f[1] | f[2]:
            df[t] = df.get(t, 0) + 1
    out: list[float] = []
    for api_t, tool_t, desc_t in fields:
        score = 0.0
        # sorted: a set's order follows the per-process hash seed, and float sums depend on order;
        # ties between APIs must break the same way in every process.
        for t in sorted(q & (api_t | tool_t | desc_t)):
            # words shared by every offered API (the tool name of a one-tool list) tell none apart
            weight = 1.0 if t in api_t else 0.6 if t in tool_t else 0.4
            score += weight / df[t]
        out.append(score)
    return out


def _copy_name(name: str, rng: random.Random) -> str:
    if rng.random() >= _ODD_COPY_RATE:
        return name
    if "/" not in name:  # a document's id: copied in another case, padded or quoted
        return rng.choice((name.lower(), f"{name} ", f"`{name}`"))
    tool, _, api = name.partition("/")
    return rng.choice(
        (
            name.lower(),
            f"{tool} / {api}",
            f"{name} ",
            f"`{name}`",
            f"{tool}/{api.title()}",
            f"{tool}/{api}".replace(" ", "  ", 1),
        )
    )


def _step_text(c: _Clause) -> str:
    obj = c.obj.strip(" ,")
    return f"{(c.verb or 'get').capitalize()} {obj}" if obj else c.text


def _api_for(step: str, selected: Sequence[str]) -> str | None:
    words = _tokens(step)
    overlap = [(len(words & _tokens(name)), -i) for i, name in enumerate(selected)]
    best = max(overlap, default=(0, 0))
    return selected[-best[1]] if best[0] > 0 else None


def _planner(query: str, apis: Sequence[tuple[str, str]], rng: random.Random, spread: float) -> str:
    scores = _scores(query, apis)
    best = max(scores, default=0.0)
    threshold = 0.5 * (1.0 + rng.uniform(-0.3, 0.4) * spread)
    relative = 0.35 * (1.0 + rng.uniform(-0.3, 0.3) * spread)
    order = sorted(range(len(apis)), key=lambda j: -scores[j])
    chosen = [j for j in order if scores[j] >= threshold and scores[j] >= relative * best]
    chosen = chosen[: rng.choice((2, 3, 3, 4, 5))]
    # A weak match, or failing that the top-listed API, picked anyway: the "wrong tool" outcome
    # that real planners show on complete retrieval misses.
    if not chosen and apis and rng.random() >= (_REFUSE_RATE if best > 0 else _REFUSE_BLIND_RATE):
        chosen = order[:1]
    selected = [_copy_name(apis[j][0], rng) for j in chosen]
    needs = _needs(query)
    if selected and rng.random() < _UNOFFERED_RATE * spread:
        noun = next((n for c in needs for n in c.nouns), "data")
        selected.append(f"{noun.title()} API/{rng.choice(('get', 'search', 'fetch'))} {noun}")

    if selected:
        steps = [_step_text(c) for c in needs][:5]
        if len(steps) < 2:
            steps.append("Call the selected APIs with the values from the request")
        steps.append("Combine the results into an answer for the user")
        steps = steps[: rng.choice((4, 5, 6, 6))]
    else:
        steps = ["Compare the request with the listed APIs", "Tell the user that none of the listed APIs can help"]

    if selected and rng.random() < _STEP_OBJECTS_RATE:
        step_objs = [{"step": s, "api": _api_for(s, selected)} for s in steps]
        return json.dumps({"steps": step_objs, "selected_apis": selected}, ensure_ascii=False)
    return json.dumps({"steps": steps, "selected_apis": selected}, ensure_ascii=False, indent=rng.choice((None, 2)))


# ---------------------------------------------------------------------------------------------
# Any JSON schema
# ---------------------------------------------------------------------------------------------

_FORMATS = {"date": "2025-01-15", "date-time": "2025-01-15T09:30:00Z", "time": "09:30:00", "email": "user@example.com",
            "uri": "https://example.com/", "uuid": "123e4567-e89b-12d3-a456-426614174000"}


def _schema_of(response_format: dict | None) -> dict | None:
    """The JSON schema a request's `response_format` carries: OpenAI's json_schema form, or llama-cpp-python's
    json_object with a `schema`; None without one."""
    if not isinstance(response_format, dict):
        return None
    inner = response_format.get("json_schema")
    schema = inner.get("schema") if isinstance(inner, dict) else response_format.get("schema")
    return schema if isinstance(schema, dict) else None


def schema_instance(schema: dict, request: str, rng: random.Random) -> object:
    """A value valid against `schema` (the JSON Schema keywords structured outputs use: type, properties,
    required, items, min/maxItems, enum, const, anyOf/oneOf/allOf, $ref to $defs, min/max(Length), formats),
    its strings read from the request: a name-like field gets a stub-like name, a query-like one the request's
    key words, any other a clause of it. One item per need of the request in an array, within its bounds.
    `pattern` is not followed (a free regular expression has no general instance)."""
    needs = _needs(request) or [_analyse(request)]
    return _instance(schema, schema, "", needs, 0, rng, 0)


def _resolve(node: dict, root: dict) -> dict:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: object = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        if isinstance(target, dict):
            return {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _instance(node: object, root: dict, field: str, needs: list[_Clause], i: int, rng: random.Random,
              depth: int) -> object:
    if not isinstance(node, dict) or depth > 12:
        return None if depth > 12 else _text_for(field, needs, i, rng)
    node = _resolve(node, root)
    if "const" in node:
        return node["const"]
    if isinstance(node.get("enum"), list) and node["enum"]:
        return rng.choice(node["enum"])
    for key in ("anyOf", "oneOf"):
        options = node.get(key)
        if isinstance(options, list) and options:
            chosen = next((o for o in options if isinstance(o, dict) and o.get("type") != "null"), options[0])
            return _instance({**{k: v for k, v in node.items() if k != key}, **_resolve(chosen, root)}, root, field,
                             needs, i, rng, depth + 1)
    if isinstance(node.get("allOf"), list):
        merged: dict = {k: v for k, v in node.items() if k != "allOf"}
        for part in node["allOf"]:
            if isinstance(part, dict):
                part = _resolve(part, root)
                merged["properties"] = {**merged.get("properties", {}), **part.get("properties", {})}
                merged["required"] = [*merged.get("required", []), *part.get("required", [])]
                merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
        return _instance(merged, root, field, needs, i, rng, depth + 1)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((t for t in kind if t != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in node else "array" if "items" in node else "string"
    if kind == "object":
        props: dict = node["properties"] if isinstance(node.get("properties"), dict) else {}
        return {name: _instance(sub, root, name, needs, i, rng, depth + 1) for name, sub in props.items()}
    if kind == "array":
        low = int(node.get("minItems", 1 if needs else 0))
        high = int(node.get("maxItems", max(low, min(len(needs), _MAX_STUBS))))
        n = max(low, min(high, len(needs)))
        items = node.get("items", {})
        prefix: list = node["prefixItems"] if isinstance(node.get("prefixItems"), list) else []
        out = [_instance(prefix[j] if j < len(prefix) else items, root, field, needs, j, rng, depth + 1)
               for j in range(n)]
        if node.get("uniqueItems"):
            unique: list = []
            for x in out:
                if x not in unique:
                    unique.append(x)
            out = unique if len(unique) >= low else out
        return out
    if kind == "integer":
        lo, hi = _bounds(node, 0, 10)
        return rng.randint(int(lo), int(hi)) if int(lo) <= int(hi) else int(lo)
    if kind == "number":
        lo, hi = _bounds(node, 0.0, 1.0)
        return round(rng.uniform(lo, hi), 3) if lo < hi else lo
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    fmt = node.get("format")
    text = _FORMATS[fmt] if fmt in _FORMATS else _text_for(field, needs, i, rng)
    min_len, max_len = int(node.get("minLength", 0)), node.get("maxLength")
    while len(text) < min_len:
        text = f"{text} {_filler(needs)}".strip()
    if isinstance(max_len, int) and len(text) > max_len:
        text = text[:max_len]
    return text


def _filler(needs: list[_Clause]) -> str:
    return " ".join(n for c in needs for n in c.nouns) or "request"


def _bounds(node: dict, lo: float, hi: float) -> tuple[float, float]:
    if isinstance(node.get("minimum"), int | float):
        lo = node["minimum"]
    if isinstance(node.get("exclusiveMinimum"), int | float):
        lo = node["exclusiveMinimum"] + 1
    if isinstance(node.get("maximum"), int | float):
        hi = node["maximum"]
    if isinstance(node.get("exclusiveMaximum"), int | float):
        hi = node["exclusiveMaximum"] - 1
    return lo, max(lo, hi)


_NAME_FIELD = re.compile(r"name|function|tool|api|id$|stub|title", re.I)
_QUERY_FIELD = re.compile(r"quer|search|keyword|term", re.I)


def _text_for(field: str, needs: list[_Clause], i: int, rng: random.Random) -> str:
    """A string for a field of a schema: from need `i` of the request, shaped by what the field's name asks."""
    c = needs[i % len(needs)] if needs else None
    if c is None:
        return "information"
    if _QUERY_FIELD.search(field):
        words = [c.verb or "get", *[n for n in c.nouns if n not in c.proper]]
        return " ".join(dict.fromkeys(words)) or c.text
    if _NAME_FIELD.search(field):
        return _stub_name(c.verb, c.nouns, c.proper, rng, 1.0)
    return _reasoning(c.text, rng)


# ---------------------------------------------------------------------------------------------
# Output dressing
# ---------------------------------------------------------------------------------------------


def _wrap(payload: str, rng: random.Random) -> str:
    r = rng.random()
    if r < _FENCE_RATE:
        return f"```json\n{payload}\n```"
    if r < _FENCE_RATE + _PROSE_RATE:
        return f"Here is my answer:\n{payload}\nLet me know if you need anything else."
    return payload


_RUNAWAY_ITEMS = 2000  # far past any sensible max_tokens: only the limit ends the reply


def _run_away(kind: str, payload: str) -> str:
    """The reply with its list going on and on (discovery: stubs; planner: steps before the selection)."""
    value = json.loads(payload)
    if kind == "discovery":
        base = value[0] if value else {"name": "get_information", "reasoning": "Answer the request."}
        value = value + [
            {"name": f"{base['name']}_{i}", "reasoning": f"{base['reasoning']} Variant {i}."}
            for i in range(2, _RUNAWAY_ITEMS)
        ]
        return json.dumps(value, ensure_ascii=False, indent=2)
    steps = value.get("steps") or ["Call the API"]
    more = [f"{steps[i % len(steps)]} (again, pass {i})" for i in range(_RUNAWAY_ITEMS)]
    return json.dumps({"steps": steps + more, "selected_apis": value.get("selected_apis", [])}, ensure_ascii=False)


def _stray(kind: str, payload: str, messages: list[dict], rng: random.Random) -> str:
    """The answer in prose and code that hold lists which are not the answer."""
    if kind == "discovery":
        before = (
            'The request mentions these places: [{"name": "Paris", "country": "France"}, '
            '{"name": "Lyon", "country": "France"}].'
        )
    else:
        _, apis = _planner_input(_content(next((m for m in reversed(messages) if m.get("role") == "user"), None)))
        # Offered names in prose are what the planner looked at, not what it picked.
        listed = json.dumps([name for name, _ in apis[:3]], ensure_ascii=False)
        before = f"I compared the request with {listed} and kept only what helps."
    code = '```python\nresp = call(params["origin"], ["a", "b"])\n```'
    answer_part = f"```json\n{payload}\n```" if rng.random() < 0.5 else payload
    return f"{before}\n\n{answer_part}\n\nTo call it:\n{code}\nOptions I skipped: [\"none\"]."
