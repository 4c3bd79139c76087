"""Request streams for ``release_tests.llm_routing``: prompts that share prefixes, and prompts
that do not. Pure (a seeded ``random.Random``), so a run is repeatable.

Text is made of 4-character words (the engine simulator counts 4 characters a token), so a
prompt of T tokens is T words.

- ``shared_prefix``: the traffic prefix caching is for.
  * 60% multi-turn chats: one of ``SYSTEM_PROMPTS`` long system prompts, then turns of a
    user message (documents pasted in: 300-1,200 tokens) and the assistant's reply, sent in
    order: a session's next turn only once its previous answer arrived and its user has
    read it (``THINK_S``, GB10 seconds: many users' sessions are open at once, as in a
    chat service), its prompt the whole conversation so far, with that answer as the
    simulator words it;
  * 40% few-shot completions: one of ``TEMPLATES`` long templates and a short question.
- ``random``: single-turn chats, each with its own system prompt and message (no prefix
  shared beyond the chat template), about as long as the shared workload's prompts on
  average (1,500 + 500-4,500 tokens).

Replies are short (16-48 tokens: classifications, extractions, tool calls): the
prefill-heavy shape where the cached prefix is most of the work; a chat with long answers
gains less.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

SYSTEM_PROMPTS, SYSTEM_TOKENS = 4, 1500
TEMPLATES, TEMPLATE_TOKENS = 8, 2500
TURNS = (3, 8)
USER_TOKENS = (300, 1200)
RANDOM_USER_TOKENS = (500, 4500)  # a random prompt about as long as a shared one, on average
QUESTION_TOKENS = (20, 80)
OUTPUT_TOKENS = (16, 48)
CHAT_SHARE = 0.6
THINK_S = (10.0, 30.0)  # a user reading an answer and typing the next turn, GB10 seconds
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
    ready_at: float = 0.0  # its user sends the next turn from then


@dataclass
class SharedPrefix:
    rng: random.Random
    clock: Callable[[], float] = time.monotonic
    think_scale: float = 1.0  # think times are divided by the engines' speedup
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
        now = self.clock()
        idle = [s for s in self.sessions if not s.busy and s.ready_at <= now]
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
        session.ready_at = self.clock() + self.rng.uniform(*THINK_S) / self.think_scale
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
                    {"role": "user", "content": words(rng, rng.randint(*RANDOM_USER_TOKENS))}]
        return LLMRequest("/v1/chat/completions",
                          {"model": MODEL, "messages": messages,
                           "max_tokens": rng.randint(*OUTPUT_TOKENS), "stream": True})

    def answered(self, request: LLMRequest, ok: bool) -> None:
        pass


def workload(name: str, seed: int, speedup: float = 1.0,
             clock: Callable[[], float] = time.monotonic) -> SharedPrefix | RandomPrompts:
    rng = random.Random(f"{name}-{seed}")
    if name == "shared_prefix":
        return SharedPrefix(rng, clock, think_scale=speedup)
    return RandomPrompts(rng)
