"""Seed 001's day of an LLM server, replayed under a fake clock against the health check.

``python -m release_tests.llm_day [--seed 22] [--hours 24] [--intervals 40,30]
[--seeded-days 1,2,3,4] [--smoke]``

The day is the one the design document ``seeds/001_6a8489db1ef4f960.txt`` (English:
``001_6a8489db1ef4f960.en.txt``) tells, on which four watchdogs restarted a healthy vLLM
server eight times: a GB10 server making about ``STEP_HZ`` engine steps a second with
``SLOTS`` slots; a batch job sending bursts of 2-4 requests of 800-2400 tokens (100-300 s)
every 5-30 min, in a third of the bursts reading a long prompt for two minutes without an
output token; half the bursts followed by a JIT compile that stalls the engine for 30-70 s. The
server is a ``tests.llm_sim`` engine reached through an in-process fetcher, the check is
fleetplane's own (``replicas.llm_health.BackendChecker``, the verdict table of
``replicas.llm_verdict``), and the restart decision is ``replicas.llm_restart.
RestartPolicy``; the command plays the owner (a RESTART restarts the engine, whose
in-flight requests fail, and a fresh check and policy judge the new process). No Ray, no
sockets, no sleeping: a 24-hour day takes about 3 s.

Per check interval (``--intervals``; the first is the production default,
``replicas.llm_health.DEFAULT_INTERVAL_S``, the others are labelled counterfactuals) it
prints and records:

- ``checks``: reads of ``/metrics`` in the day (one per interval);
- ``full_slot_checks``: checks that found every slot taken, where a check that sends a real
  request (the seed's watchdog) would have queued behind the batch or timed out;
- ``busy`` / ``idle`` / ``read_again`` / ``stuck`` / ``dead`` / ``no_metrics``: the
  check's verdicts (``read_again``: a burst had just arrived, nothing to compare with yet);
- ``test_requests`` and ``test_requests_while_busy``: tiny completions the check sent, and
  those sent while any request was present (must be 0);
- ``restarts``: restarts of this healthy server (must be 0 at the production interval, or
  the first one given: ``main`` returns 1 otherwise, or when nothing was checked), and
  ``requests_failed_by_restarts``;
- ``token_based_stucks``: places where the check's first version, which counted output
  tokens instead of engine steps, would have seen no progress over two intervals (each
  one a restart of a healthy server);
- ``stuck_engine_restart_after_s``: a separate scenario, an engine that stops stepping
  with requests in its slots: virtual seconds from its last step to the RESTART (two
  intervals);
- ``per_hour``: checks, full-slot checks, BUSY verdicts, token-based stucks, bursts,
  stalls begun and seconds stalled per hour of the day (for a plot).

``--seeded-days`` replays the same day with other seeds at each interval and counts the
days on which the server was restarted. ``--smoke``: the same code on a 1-hour day (about
a second). Results: ``release_tests.results.record("llm_day", ...)``, per-check rows as
Parquet; the last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter

from controlplane.clock import FakeClock
from release_tests.results import record
from replicas.llm_health import DEFAULT_INTERVAL_S, BackendChecker, CheckSettings
from replicas.llm_restart import Decision, RestartPolicy
from replicas.llm_verdict import Action, Verdict
from tests.llm_sim.engine import SimEngine
from tests.llm_sim.fake_http import SimFetcher

INTERVAL_S = DEFAULT_INTERVAL_S  # the production default: two intervals outlast a 70 s stall
STEP_HZ = 8                # seed 001: about 8 tokens a second for one request
SLOTS = 2                  # bursts of 2-4 requests fill every slot
LONG_PREFILL_STEPS = 960   # two minutes reading a long prompt: steps, no output token
SEED = 22                  # the day MEASURED.md publishes
FIRST_BURST_AT_S = 60.0
COUNTERFACTUAL_S = 30.0    # two intervals (60 s) shorter than the longest stall (70 s)
SEEDED_DAYS = (1, 2, 3, 4)
SMOKE_HOURS = 1.0
VERDICT_KEYS = ("busy", "idle", "read_again", "stuck", "dead", "no_metrics")


class Day:
    """One engine, its check and the policy under a fake clock; the caller plays the owner."""

    def __init__(self, seed: int = 1, interval_s: float = INTERVAL_S) -> None:
        self.clock = FakeClock(start_s=0.0)
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.engine = SimEngine("gb10-model", SLOTS, wall=self.clock.monotonic)
        self.fetcher = SimFetcher(self.engine)
        self.checker = self._new_checker()
        self.policy = RestartPolicy()
        self.stalled = (0.0, 0.0)  # [from, until): the engine takes no step
        self.stalls: list[tuple[float, float]] = []
        self.bursts: list[float] = []
        self.next_burst_at = float("inf")
        self.reads = []          # (snapshot, slots were full) per check
        self.verdicts = []
        self.log: list[dict] = []  # per check: time, decision, whether it sent a request
        self.restarts = 0        # restarts the owner carried out (``run(owner=True)``)
        self.failed_by_restarts = 0

    def _new_checker(self) -> BackendChecker:
        return BackendChecker("http://gb10:8000", self.fetcher, self.clock,
                              CheckSettings(interval_s=self.interval_s))

    def advance(self, seconds: float) -> None:
        """Step the engine at STEP_HZ; idle stretches are skipped in one jump."""
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end:
            now = self.clock.monotonic()
            if now >= self.next_burst_at:
                self._burst()
            if not self.engine.busy:
                self.clock.advance(max(0.0, min(end, self.next_burst_at) - now))
                continue
            self.clock.advance(min(1 / STEP_HZ, end - now))
            if not self.stalled[0] <= self.clock.monotonic() < self.stalled[1]:
                self.engine.step()

    def _burst(self) -> None:
        self.bursts.append(self.clock.monotonic())
        prefill = self.rng.choice([0, 40, LONG_PREFILL_STEPS])
        for _ in range(self.rng.randint(2, 4)):
            self.engine.submit(self.rng.randint(800, 2400), prefill, internal=True)
        if self.rng.random() < 0.5:  # a JIT compile stalls the engine for 30-70 s
            start = self.clock.monotonic() + self.rng.uniform(5, 120)
            self.stalled = (start, start + self.rng.uniform(30, 70))
            self.stalls.append(self.stalled)
        self.next_burst_at = self.clock.monotonic() + self.rng.uniform(5 * 60, 30 * 60)

    def check(self) -> Decision:
        full = self.engine.full
        step = self.checker.check_once()
        self.reads.append((step.snapshot, full))
        j = step.judgement
        verdict = j.verdict if j.action is Action.REPORT else None
        self.verdicts.append(verdict)
        self.policy, decision = self.policy.decide(verdict, self.clock.monotonic(), j.reason)
        self.log.append({"t_s": self.clock.monotonic(), "decision": decision.value,
                         "sent_test_request": step.sent_test_request,
                         "stalled": self.stalled[0] <= self.clock.monotonic() < self.stalled[1]})
        return decision

    def restart_server(self) -> None:
        """The owner's restart: a new process, every in-flight request failed, and a fresh
        check and policy (the replacement replica's own) judging it."""
        self.failed_by_restarts += len(self.engine.running) + len(self.engine.waiting)
        self.engine.restart()
        self.restarts += 1
        self.checker = self._new_checker()
        self.policy = RestartPolicy()

    def run(self, seconds: float, owner: bool = False) -> list[Decision]:
        """A check every interval for ``seconds``; with ``owner``, a RESTART is carried out."""
        decisions = []
        for _ in range(int(seconds / self.interval_s)):
            decisions.append(self.check())
            if owner and decisions[-1] is Decision.RESTART:
                self.restart_server()
            self.advance(self.interval_s)
        return decisions


def token_based_stuck_at(reads) -> list[int]:
    """The checks at which the first version of the check (output tokens as progress)
    would say stuck: requests present at three reads in a row, no new output token."""
    at = []
    for i, ((a, _), (b, _), (c, _)) in enumerate(zip(reads, reads[1:], reads[2:]), start=2):
        if all(s is not None and s.requests_present for s in (a, b, c)) and (
                a.generation_tokens == b.generation_tokens == c.generation_tokens):
            at.append(i)
    return at


def token_based_stucks(reads) -> int:
    """Where the first version of the check (output tokens as progress) would say stuck."""
    return len(token_based_stuck_at(reads))


def seed_day(seed: int = SEED, hours: float = 24.0, interval_s: float = INTERVAL_S,
             owner: bool = True) -> Day:
    """The day played: bursts from ``FIRST_BURST_AT_S``, a check every interval."""
    day = Day(seed=seed, interval_s=interval_s)
    day.next_burst_at = FIRST_BURST_AT_S
    day.run(hours * 3600, owner=owner)
    return day


def stuck_engine_restart_after_s(interval_s: float = INTERVAL_S) -> float | None:
    """An engine that stops stepping with every slot taken (and one request waiting), right
    after a BUSY read: virtual seconds from its last step to the RESTART."""
    day = Day(interval_s=interval_s)
    for _ in range(SLOTS + 1):
        day.engine.submit(100_000, internal=True)
    day.run(2 * interval_s)
    if day.check() is not Decision.KEEP or day.verdicts[-1] is not Verdict.BUSY:
        return None
    day.engine.set_fault("stuck")
    stuck_at = day.clock.monotonic()
    for _ in range(10):
        day.advance(interval_s)
        if day.check() is Decision.RESTART:
            return day.policy.restart_issued_at_s - stuck_at
    return None


# ---- figures ---------------------------------------------------------------------------------
def verdict_counts(verdicts) -> dict[str, int]:
    counts = Counter("read_again" if v is None else v.value.replace("-", "_") for v in verdicts)
    return {key: counts.get(key, 0) for key in VERDICT_KEYS}


def figures(day: Day, hours: float) -> dict:
    """What one replayed day shows (see the module's docstring)."""
    reads, log = day.reads, day.log
    return {"interval_s": day.interval_s,
            "role": "production default" if day.interval_s == INTERVAL_S else "counterfactual",
            "checks": len(reads),
            "full_slot_checks": sum(full for _, full in reads),
            **verdict_counts(day.verdicts),
            "test_requests": sum(r["sent_test_request"] for r in log),
            "test_requests_while_busy": day.fetcher.completions_while_busy,
            "test_requests_while_full": day.fetcher.completions_while_full,
            "restarts": day.restarts,
            "first_restart_at_s": next((r["t_s"] for r in log if r["decision"] == "restart"),
                                       None),
            "requests_failed_by_restarts": day.failed_by_restarts,
            "token_based_stucks": token_based_stucks(reads),
            "bursts": len(day.bursts), "stalls": len(day.stalls),
            "stuck_engine_restart_after_s": stuck_engine_restart_after_s(day.interval_s),
            "per_hour": per_hour(day, hours)}


def per_hour(day: Day, hours: float) -> dict[str, list]:
    """The day in hour bins, for a plot."""
    n = max(1, int(round(hours)))
    series = {k: [0] * n for k in ("checks", "full_slot_checks", "busy", "token_based_stucks",
                                   "bursts", "stalls")}
    series["stalled_s"] = [0.0] * n

    def bin_of(t_s: float) -> int:
        return min(n - 1, int(t_s // 3600))

    stuck_at = set(token_based_stuck_at(day.reads))
    for i, (row, (_, full), verdict) in enumerate(zip(day.log, day.reads, day.verdicts)):
        h = bin_of(row["t_s"])
        series["checks"][h] += 1
        series["full_slot_checks"][h] += full
        series["busy"][h] += verdict is Verdict.BUSY
        series["token_based_stucks"][h] += i in stuck_at
    for t_s in day.bursts:
        series["bursts"][bin_of(t_s)] += 1
    for start, end in day.stalls:
        series["stalls"][bin_of(start)] += 1
        for h in range(bin_of(start), bin_of(end) + 1):  # split the stall over hour bins
            overlap = min(end, (h + 1) * 3600) - max(start, h * 3600)
            series["stalled_s"][h] = round(series["stalled_s"][h] + max(0.0, overlap), 1)
    return {"hour": list(range(n)), **series}


def check_rows(day: Day) -> list[dict]:
    """One row per check: the Parquet file's."""
    stuck_at = set(token_based_stuck_at(day.reads))
    rows = []
    for i, (row, (snap, full), verdict) in enumerate(zip(day.log, day.reads, day.verdicts)):
        rows.append({"interval_s": day.interval_s, **row, "slots_full": bool(full),
                     "verdict": verdict.value if verdict else None,
                     "running": snap.running if snap else None,
                     "waiting": snap.waiting if snap else None,
                     "steps": snap.steps if snap else None,
                     "generation_tokens": snap.generation_tokens if snap else None,
                     "token_based_stuck": i in stuck_at})
    return rows


def seeded_days(seeds: list[int], intervals: list[float], hours: float) -> list[dict]:
    """The same day with other seeds: per interval, the days on which it was restarted."""
    out = []
    for interval_s in intervals:
        restarts = [seed_day(seed, hours, interval_s).restarts for seed in seeds]
        out.append({"interval_s": interval_s, "seeds": ",".join(map(str, seeds)),
                    "restarts_per_day": ",".join(map(str, restarts)),
                    "days_with_a_restart": sum(r > 0 for r in restarts), "days": len(seeds)})
    return out


# ---- the command -----------------------------------------------------------------------------
COLUMNS = [("interval_s", "interval"), ("checks", "checks"), ("full_slot_checks", "full"),
           ("busy", "busy"), ("idle", "idle"), ("read_again", "read-again"),
           ("stuck", "stuck"), ("test_requests_while_busy", "tests-busy"),
           ("restarts", "restarts"), ("token_based_stucks", "token-stucks"),
           ("stuck_engine_restart_after_s", "stuck->restart s")]


def print_table(params: dict, by_interval: dict[str, dict], seeded: list[dict]) -> None:
    print(f"\nllm_day: seed {params['seed']}, {params['hours']:g} h, {params['step_hz']} "
          f"engine steps/s, {params['slots']} slots, first burst at "
          f"{params['first_burst_at_s']:g} s")
    print("  ".join(f"{label:>{max(len(label), 6)}s}" for _, label in COLUMNS) + "  role")
    for figs in by_interval.values():
        cells = [figs[key] for key, _ in COLUMNS]
        print("  ".join(f"{_fmt(v):>{max(len(label), 6)}s}"
                        for v, (_, label) in zip(cells, COLUMNS)) + f"  {figs['role']}")
    for row in seeded:
        print(f"seeded days {row['seeds']} at {row['interval_s']:g} s: restarts per day "
              f"{row['restarts_per_day']} ({row['days_with_a_restart']} of {row['days']} "
              "days with a restart)")


def problems(by_interval: dict[str, dict], seeded: list[dict],
             guarded: list[float]) -> list[str]:
    """What makes the run a failure, at the intervals that must restart nothing (the
    production default, or the first given)."""
    out = []
    for interval_s in guarded:
        figs = by_interval[f"{interval_s:g} s"]
        if figs["checks"] == 0:
            out.append(f"nothing was checked at {interval_s:g} s")
        if figs["restarts"] > 0:
            out.append(f"the healthy server was restarted at {interval_s:g} s")
        if figs["test_requests_while_busy"] > 0:
            out.append(f"a test request was sent to a busy server at {interval_s:g} s")
        if any(r["days_with_a_restart"] for r in seeded if r["interval_s"] == interval_s):
            out.append(f"a seeded day's healthy server was restarted at {interval_s:g} s")
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--intervals", default=f"{INTERVAL_S:g},{COUNTERFACTUAL_S:g}",
                   help="check intervals (s), comma-separated; the production default "
                        f"({INTERVAL_S:g}), or else the first, must restart nothing")
    p.add_argument("--interval-s", type=float, default=None,
                   help="one interval only (replaces --intervals)")
    p.add_argument("--seeded-days", default=",".join(map(str, SEEDED_DAYS)),
                   help="other seeds replayed at each interval ('' for none)")
    p.add_argument("--smoke", action="store_true",
                   help=f"a {SMOKE_HOURS:g}-hour day: the same code in about a second")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    hours = SMOKE_HOURS if args.smoke else args.hours
    intervals = [args.interval_s] if args.interval_s else _floats(args.intervals)
    seeds = [int(s) for s in _floats(args.seeded_days)]
    if not intervals:
        _parser().error("no check interval given")
    params = {"seed": args.seed, "hours": hours, "intervals_s": intervals,
              "production_interval_s": INTERVAL_S, "step_hz": STEP_HZ, "slots": SLOTS,
              "long_prefill_steps": LONG_PREFILL_STEPS, "first_burst_at_s": FIRST_BURST_AT_S,
              "seeded_days": seeds}
    by_interval, rows = {}, []
    for interval_s in intervals:
        day = seed_day(args.seed, hours, interval_s)
        by_interval[f"{interval_s:g} s"] = figures(day, hours)
        rows += check_rows(day)
    seeded = seeded_days(seeds, intervals, hours) if seeds else []
    print_table(params, by_interval, seeded)
    summary = {"parameters": params, "intervals": by_interval, "seeded_days": seeded}
    path = record("llm_day", summary, rows, smoke=args.smoke, argv=argv)
    print(f"results: {path}")
    broken = problems(by_interval, seeded, [i for i in intervals if i == INTERVAL_S]
                      or intervals[:1])
    for why in broken:
        print(f"BROKEN: {why}", file=sys.stderr)
    print(json.dumps({"llm_day": {k: {kk: v for kk, v in f.items() if kk != "per_hour"}
                                  for k, f in by_interval.items()}}))
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
