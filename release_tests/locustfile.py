"""Mixed traffic for ``fleetplane run release_tests/soak.yaml``: the locust half of
``python -m release_tests.soak``, which starts both and reads the reports. By hand:

    locust -f release_tests/locustfile.py --headless --host http://127.0.0.1:8031 \
        --soak-duration-s 60 --stop-timeout 35 --csv /tmp/soak --html /tmp/soak.html

Three kinds of user, each a request type of its own in locust's stats:

- ``steady``: short requests, each user at a fixed pace (``constant_throughput``); always on;
- ``burst``: short requests, a faster pace; they exist only while ``SoakShape`` spikes the
  user count (the last ``--burst-for-s`` of every ``--burst-every-s``);
- ``stream``: one streamed response read line by line to its ``end`` over many seconds.

Steady and stream users are ``fixed_count`` users: locust spawns them first and, when the
shape lowers the count after a burst, stops the newest users first (its dispatcher pops its
list of active users), so a burst only ever adds and removes burst users and never takes a
stream's place. Every non-2xx answer is a failure (a 429/503 too: the soak's config sheds
nothing, so backpressure here means something went wrong); so is a stream cut short (an
error while reading, fewer lines than asked for, or no ``end``). A stream's latency is the
whole read, first byte to ``end`` (locust's own figure for ``stream=True`` stops at the
head).
"""

from __future__ import annotations

import time

from locust import FastHttpUser, LoadTestShape, constant, constant_throughput, events, task

SPAWN_RATE = 100  # users a second: a burst arrives within one shape tick (1 s)
CSV_WRITE_WAIT_S = 1.5  # > locust.stats.CSV_STATS_INTERVAL_SEC (1 s): one more write


@events.init_command_line_parser.add_listener
def _soak_options(parser) -> None:
    for flag, kind, default, text in (
            ("--soak-duration-s", float, 300.0, "how long the shape runs"),
            ("--steady-users", int, 8, "steady users (short requests, always on)"),
            ("--steady-rate", float, 10.0, "requests/s per steady user"),
            ("--burst-users", int, 32, "users a burst adds"),
            ("--burst-rate", float, 20.0, "requests/s per burst user"),
            ("--burst-every-s", float, 30.0, "one burst per this many seconds"),
            ("--burst-for-s", float, 5.0, "how long a burst lasts (the end of each period)"),
            ("--stream-users", int, 4, "stream users (one stream at a time each)"),
            ("--stream-chunks", int, 80, "lines per stream"),
            ("--stream-every-s", float, 0.25, "seconds between a stream's lines")):
        parser.add_argument(flag, type=kind, default=default, help=f"soak: {text}",
                            include_in_web_ui=False)


@events.init.add_listener
def _apply_options(environment, **_kwargs) -> None:
    """User counts and paces are class attributes that locust reads when it spawns."""
    options = environment.parsed_options
    if options is None:  # started from locust's library API without a command line
        return
    SteadyUser.fixed_count = options.steady_users
    SteadyUser.wait_time = constant_throughput(options.steady_rate)
    BurstUser.wait_time = constant_throughput(options.burst_rate)
    StreamUser.fixed_count = options.stream_users


def _short(user: FastHttpUser, name: str) -> None:
    with user.client.get("/soak/short", name=name, catch_response=True) as response:
        if response.status_code != 200 or response.text != "ok":
            response.failure(f"status {response.status_code}")
        else:
            response.success()


class SteadyUser(FastHttpUser):
    """Short requests at a steady pace, for the whole soak."""

    fixed_count = 8
    wait_time = constant_throughput(10.0)

    @task
    def short(self) -> None:
        _short(self, "steady")


class BurstUser(FastHttpUser):
    """Short requests at a fast pace; only alive during a burst (the shape's extra users)."""

    weight = 1
    wait_time = constant_throughput(20.0)

    @task
    def short(self) -> None:
        _short(self, "burst")


class StreamUser(FastHttpUser):
    """One long stream after another, each read to its ``end``."""

    fixed_count = 4
    wait_time = constant(0.5)

    @task
    def stream(self) -> None:
        options = self.environment.parsed_options
        chunks, every_s = (options.stream_chunks, options.stream_every_s) if options else (80, 0.25)
        url = f"/soak/stream?chunks={chunks}&every_s={every_s}"
        started = time.perf_counter()
        with self.client.get(url, name="stream", stream=True, catch_response=True) as response:
            if response.request_meta["exception"] is not None or response.status_code != 200:
                response.failure(f"status {response.status_code}")
                return
            try:
                body = "".join(response.iter_content(chunk_size=256))
            except Exception as e:  # reset, timed out: the stream was cut short
                body, error = None, e
            response.request_meta["response_time"] = (time.perf_counter() - started) * 1000
            if body is None:
                response.failure(f"stream cut short: {type(error).__name__}")
                return
            response.request_meta["response_length"] = len(body)
            verdict = _read_to_the_end(body.splitlines(), chunks)
            if verdict:
                response.failure(verdict)
            else:
                response.success()


def _read_to_the_end(lines: list[str], chunks: int) -> str:
    """'' when ``lines`` are the whole stream, else why not (grouped in locust's failures)."""
    expected = [f"{i}/{chunks}" for i in range(1, chunks + 1)] + ["end"]
    if lines == expected:
        return ""
    if lines == expected[:len(lines)]:
        return "stream cut short: no end"
    return "stream garbled"


class SoakShape(LoadTestShape):
    """Steady and stream users throughout; burst users added for the last ``--burst-for-s``
    of every ``--burst-every-s``. After ``--soak-duration-s`` every user is stopped (each
    finishing what it holds, up to ``--stop-timeout``) and the test ends a little later:
    locust writes its CSV once a second and stops writing at quit, so a stream that ended
    in the last second would be in the HTML report but not in the CSV."""

    _drained_at_s: float | None = None

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        now_s = self.get_run_time()
        if now_s < options.soak_duration_s:
            base = options.steady_users + options.stream_users
            bursting = now_s % options.burst_every_s >= options.burst_every_s - options.burst_for_s
            return base + (options.burst_users if bursting else 0), SPAWN_RATE
        give_up_s = options.soak_duration_s + (options.stop_timeout or 0) + 5
        if self.get_current_user_count() > 0 and now_s < give_up_s:
            return 0, SPAWN_RATE
        if self._drained_at_s is None:
            self._drained_at_s = now_s
        return None if now_s - self._drained_at_s >= CSV_WRITE_WAIT_S else (0, SPAWN_RATE)
