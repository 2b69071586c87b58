"""Fact extraction by the configured model (M4): prompt, call, parse."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage, SystemMessage

from shared.errors import UpstreamFailed
from shared.memory.base import CATEGORIES, Fact, MemoryUpdate, NewFact
from shared.vocab import EXTRACT_TASK

EXTRACT_PROMPT = f"""{EXTRACT_TASK}
Extract durable facts about the user from the conversation below: stated preferences,
standing instructions, facts about them, and corrections of earlier facts. Ignore
one-off requests. The user's stored facts are listed under "Known facts:" as
`- [id] (category) content`; when a new fact corrects or contradicts one of them, put that
id in its "replaces". Answer with JSON only:
{{"facts": [{{"category": one of {list(CATEGORIES)}, "content": "...", "confidence": 0..1,
"replaces": ["id", ...]}}]}}
Answer {{"facts": []}} when there is nothing durable."""
KNOWN_FACTS = "Known facts:"

_FENCE = "```"


def unfence(text: str) -> str:
    """`text` (already stripped) without a Markdown code fence around it.

    What `re.sub(r"^```(?:json)?\\s*|\\s*```$", "", text)` did, in linear time: that
    regex tries `\\s*```$` from every position of a whitespace run, and the model's
    answer can echo user text.
    """
    if text.startswith(_FENCE):
        text = text[len(_FENCE) :]
        text = text.removeprefix("json").lstrip()
    if text.endswith(_FENCE):
        text = text[: -len(_FENCE)].rstrip()
    return text


class ExtractionFailed(UpstreamFailed):
    """The extraction model failed or answered something that is not the JSON asked for."""

    code = "memory_extraction_failed"


def transcript(update: MemoryUpdate, known: Sequence[Fact] = ()) -> str:
    """The update's messages as `User:`/`Assistant:` lines, then the known facts."""
    role = {"user": "User", "assistant": "Assistant"}
    lines = [f"{role.get(m['role'], m['role'])}: {m['content']}" for m in update.messages]
    if update.signals:
        lines.append(f"(signals: {', '.join(update.signals)})")
    if known:
        lines.append(KNOWN_FACTS)
        lines += [f"- [{f.fact_id}] ({f.category}) {f.content}" for f in known]
    return "\n".join(lines)


def parse_facts(text: str, known_ids: Iterable[str] = ()) -> list[NewFact]:
    """The facts of an extraction answer; `ExtractionFailed` if it is not that JSON.

    A `replaces` id the model was not shown (a typo, an invention, another user's) is
    dropped: only the user's own known facts can be superseded.
    """
    allowed = set(known_ids)
    try:
        raw: Any = json.loads(unfence(text.strip()))
        items = raw["facts"]
        if not isinstance(items, list):
            raise TypeError("facts is not a list")
        facts = []
        for item in items:
            content = str(item["content"]).strip()
            if content:
                replaces = item.get("replaces") or []
                if not isinstance(replaces, list):
                    raise TypeError("replaces is not a list")
                facts.append(
                    NewFact(
                        category=str(item.get("category") or "fact"),
                        content=content,
                        confidence=float(item.get("confidence", 0.5)),
                        replaces=tuple(str(r) for r in replaces if str(r) in allowed),
                    )
                )
        return facts
    except (ValueError, KeyError, TypeError) as exc:
        raise ExtractionFailed(f"extraction answer is not facts JSON: {exc}") from exc


def extract_facts(
    model: BaseChatModel, update: MemoryUpdate, known: Sequence[Fact] = ()
) -> list[NewFact]:
    """Ask the model for the facts in one (merged) update, given the user's known facts."""
    if not any(m["role"] == "user" for m in update.messages):
        return []
    try:
        reply = model.invoke(
            [SystemMessage(EXTRACT_PROMPT), HumanMessage(transcript(update, known))],
            config={"tags": ["middleware:memory"]},
        )
    except Exception as exc:  # any model failure is a retryable extraction failure
        raise ExtractionFailed(f"extraction model failed: {exc!r}") from exc
    return parse_facts(reply.text, (f.fact_id for f in known))
