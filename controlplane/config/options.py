"""The instance-wide sections of a deploy config: ``http_options`` (with the limits on
what one client may send), ``controller_options``, and a deployment's
``backpressure_config``. Split from ``schema`` by concept; ``schema`` re-exports them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from controlplane.config.bounds import BuildTimeoutSeconds, PeriodSeconds, Shards
from controlplane.config.serve_compat import ServeControllerFields, ServeHTTPFields
from controlplane.wire import HTTPLimits

_LIMITS = HTTPLimits()  # the limits' defaults, stated once on the record listeners get

MODEL_CONFIG = ConfigDict(extra="forbid", frozen=True)
_MODEL_CONFIG = MODEL_CONFIG


class HTTPOptions(ServeHTTPFields):
    model_config = _MODEL_CONFIG

    host: str = Field("127.0.0.1", min_length=1, description="Address the HTTP proxy binds to.")
    port: int = Field(8000, strict=True, ge=1, le=65535,
                      description="TCP port the HTTP proxy listens on.")
    proxies_per_node: int = Field(
        2, strict=True, ge=1, le=8, description="Proxy actors sharing the port on each node "
        "(SO_REUSEPORT): while one restarts, the others keep serving.")
    ingress: Literal["proxy", "haproxy"] = Field(
        "proxy", description="proxy: every request through the proxy actors; haproxy: a real "
        "HAProxy per node in front of replicas that serve HTTP themselves.")
    deregistration_window_s: float = Field(
        2.0, strict=True, ge=0, le=300, allow_inf_nan=False,
        description="haproxy mode: how long a leaving replica stays reachable after HAProxy "
        "stopped sending it new requests.")
    # What one client may send (controlplane/routing/http_limits.py); the proxy and, in
    # haproxy mode, the replicas' own listeners enforce them. Strict: never a bool.
    max_request_body_bytes: int = Field(
        _LIMITS.max_request_body_bytes, strict=True, ge=1024, le=2**32,
        description="Largest request body, in bytes (default 64 MiB): a bigger declared "
        "Content-Length is answered 413 before a byte of it is read, a chunked body 413 as "
        "soon as it passes the limit. The proxy holds a body whole before routing it, so "
        "this also bounds its memory per request. 64 MiB takes a million-token prompt "
        "(~5 MB of JSON), a 25 MB audio upload even base64-encoded in JSON (~34 MB), and "
        "refuses a 100 MB body; raise it for larger uploads.")
    max_header_bytes: int = Field(
        _LIMITS.max_header_bytes, strict=True, ge=1024, le=2**24,
        description="Largest request head (request line and headers), in bytes (default "
        "64 KiB: big cookies and tokens fit); a larger one is answered 431 and the "
        "connection closed. In haproxy mode HAProxy answers the 431 itself; its buffer "
        "is sized 16 KiB over this, and a head over the buffer gets HAProxy's own 400.")
    request_header_timeout_s: float = Field(
        _LIMITS.request_header_timeout_s, strict=True, ge=0.1, le=3600, allow_inf_nan=False,
        description="Longest time from a connection's open (or a request's first byte) to "
        "its complete head (default 30 s): a slow client (slowloris) is answered 408 and "
        "disconnected. In haproxy mode, HAProxy's `timeout http-request`.")
    request_body_timeout_s: float = Field(
        _LIMITS.request_body_timeout_s, strict=True, ge=1, le=3600, allow_inf_nan=False,
        description="Longest time from a request's complete head to its complete body "
        "(default 60 s: 64 MiB at about 1 MB/s): a body still arriving then is answered "
        "408 and the connection closed, so a client that trickles a body cannot hold a "
        "connection and the memory of the body. Raise it for slow uploads of large bodies.")
    keep_alive_timeout_s: float = Field(
        _LIMITS.keep_alive_timeout_s, strict=True, ge=1, le=3600, allow_inf_nan=False,
        description="How long an idle connection is kept open between requests (Ray Serve's "
        "field, and its default: longer than the 60 s idle timeout of common load "
        "balancers, so one in front never reuses a connection the proxy just closed). In "
        "haproxy mode, HAProxy's `timeout http-keep-alive`.")
    max_connections: int = Field(
        _LIMITS.max_connections, strict=True, ge=1, le=1_000_000,
        description="Most connections open at once on each listener (each proxy; in "
        "haproxy mode HAProxy's frontend and each replica's listener; default 10000): over "
        "it a proxy or replica closes a new connection at once, before reading it, and "
        "HAProxy leaves it waiting in the kernel's queue until one closes.")
    show_error_messages: bool = Field(
        False, strict=True,
        description="Development only: a user exception's 500 also carries the exception's "
        "text. Off (the default), the body names only a request id, and the log line with "
        "that id has the traceback: an exception's text can carry secrets (Ray Serve "
        "answers a bare 'Internal Server Error').")

    def limits(self) -> HTTPLimits:
        """What each listener enforces of these options."""
        return HTTPLimits(
            max_request_body_bytes=self.max_request_body_bytes,
            max_header_bytes=self.max_header_bytes,
            request_header_timeout_s=self.request_header_timeout_s,
            keep_alive_timeout_s=self.keep_alive_timeout_s,
            request_body_timeout_s=self.request_body_timeout_s,
            max_connections=self.max_connections)


class ControllerOptions(ServeControllerFields):
    model_config = _MODEL_CONFIG

    num_shards: Shards = Field(2, description="Shards the deployments are split over.")
    build_timeout_s: BuildTimeoutSeconds = Field(
        120.0, description="Deadline for importing and building the applications of one deploy.")


class BackpressureConfig(BaseModel):
    model_config = _MODEL_CONFIG

    status_code: Literal[429, 503] = Field(503, description="HTTP status of a request shed when full.")
    retry_after_s: PeriodSeconds | None = Field(
        None, description="Retry-After hint in seconds (rounded up when sent); None sends none."
    )
    retry_after_policy: Literal["static", "router_queue_drain_rate", "queue_drain_rate",
                                "arrival_aware", "cluster_informed"] = Field(
        "static", description="How Retry-After is chosen: the static retry_after_s; computed "
        "from the rejecting router's queue depth and drain rate (router_queue_drain_rate, "
        "seed 002; queue_drain_rate is upstream Ray Serve's name for it); arrival_aware: "
        "each rejected client booked a future second with room left by the arrivals; "
        "or cluster_informed: arrival_aware over every router's queue and rates "
        "and a scale-up's expected capacity, as the shard publishes them about once a "
        "second. The computed policies fall back to retry_after_s, then to no header.")

    @field_validator("retry_after_policy")
    @classmethod
    def _upstream_name(cls, value: str) -> str:
        return "router_queue_drain_rate" if value == "queue_drain_rate" else value
