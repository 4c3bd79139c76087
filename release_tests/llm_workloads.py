"""Request streams for ``release_tests.llm_routing``: prompts that share prefixes, and prompts
that do not. Pure (a seeded ``random.Random``), so a run is repeatable.

Text is made of 4-character words (the engine simulator counts 4 characters a token), so a
prompt of T tokens is T words.

- ``shared_prefix``: the traffic prefix caching is for.
  * 60% multi-turn chats: one of ``SYSTEM_PROMPTS`` long system prompts, then turns of a
    user message (documents pasted in: 150-600 tokens) and the assistant's reply, sent in
    order: a session's next turn only after its previous answer arrived (its prompt holds
    the whole conversation so far, with that answer as the simulator words it);
  * 40% few-shot completions: one of ``TEMPLATES`` long templates and a short question.
- ``random``: single-turn chats, each with its own system prompt and message (no prefix
  shared beyond the chat template), as long as the shared workload's prompts.

Replies are short (16-48 tokens: classifications, extractions, tool calls): the
prefill-heavy shape where the cached prefix is most of the work; a chat with long answers
gains less.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

SYSTEM_PROMPTS, SYSTEM_TOKENS = 4, 1500
TEMPLATES, TEMPLATE_TOKENS = 8, 2500
TURNS = (2, 6)
USER_TOKENS = (150, 600)
QUESTION_TOKENS = (20, 80)
OUTPUT_TOKENS = (16, 48)
CHAT_SHARE = 0.6
WORKLOADS = ("shared_prefix", "random")
MODEL = "routing-sim"


def words(rng: random.Random, tokens: int) -> str:
    """``tokens`` words of 3 letters and a space."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(f"{''.join(rng.choices(letters, k=3))} " for _ in range(tokens))


def reply(tokens: int) -> str:
    """The simulator's answer of ``tokens`` tokens."""
    return " tok" * tokens


@dataclass
class LLMRequest:
    path: str  # below the route prefix: /v1/chat/completions or /v1/completions
    body: dict[str, Any]
    session: "Session | None" = None

    @property
    def prompt_tokens(self) -> int:
        if "prompt" in self.body:
            return len(self.body["prompt"]) // 4
        return sum(len(m["content"]) for m in self.body["messages"]) // 4


@dataclass
class Session:
    messages: list[dict[str, str]]
    turns_left: int
    busy: bool = False
    id: int = 0


@dataclass
class SharedPrefix:
    rng: random.Random
    systems: list[str] = field(default_factory=list)
    templates: list[str] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    started: int = 0

    def __post_init__(self) -> None:
        self.systems = [words(self.rng, SYSTEM_TOKENS) for _ in range(SYSTEM_PROMPTS)]
        self.templates = [words(self.rng, TEMPLATE_TOKENS) for _ in range(TEMPLATES)]

    def next(self) -> LLMRequest:
        rng = self.rng
        max_tokens = rng.randint(*OUTPUT_TOKENS)
        if rng.random() >= CHAT_SHARE:
            prompt = rng.choice(self.templates) + words(rng, rng.randint(*QUESTION_TOKENS))
            return LLMRequest("/v1/completions", {"model": MODEL, "prompt": prompt,
                                                  "max_tokens": max_tokens, "stream": True})
        session = self._idle_session()
        session.busy = True
        session.turns_left -= 1
        session.messages.append({"role": "user",
                                 "content": words(rng, rng.randint(*USER_TOKENS))})
        body = {"model": MODEL, "messages": list(session.messages), "max_tokens": max_tokens,
                "stream": True}
        return LLMRequest("/v1/chat/completions", body, session)

    def _idle_session(self) -> Session:
        idle = [s for s in self.sessions if not s.busy]
        if idle:
            return self.rng.choice(idle)
        self.started += 1
        session = Session([{"role": "system", "content": self.rng.choice(self.systems)}],
                          self.rng.randint(*TURNS), id=self.started)
        self.sessions.append(session)
        return session

    def answered(self, request: LLMRequest, ok: bool) -> None:
        """Its answer arrived (or failed): the session may send its next turn, or ends."""
        session = request.session
        if session is None:
            return
        session.busy = False
        if ok:
            session.messages.append({"role": "assistant",
                                     "content": reply(request.body["max_tokens"])})
        if not ok or session.turns_left <= 0:
            self.sessions.remove(session)


@dataclass
class RandomPrompts:
    rng: random.Random

    def next(self) -> LLMRequest:
        rng = self.rng
        messages = [{"role": "system", "content": words(rng, SYSTEM_TOKENS)},
                    {"role": "user", "content": words(rng, rng.randint(*USER_TOKENS))}]
        return LLMRequest("/v1/chat/completions",
                          {"model": MODEL, "messages": messages,
                           "max_tokens": rng.randint(*OUTPUT_TOKENS), "stream": True})

    def answered(self, request: LLMRequest, ok: bool) -> None:
        pass


def workload(name: str, seed: int) -> SharedPrefix | RandomPrompts:
    rng = random.Random(f"{name}-{seed}")
    return SharedPrefix(rng) if name == "shared_prefix" else RandomPrompts(rng)
