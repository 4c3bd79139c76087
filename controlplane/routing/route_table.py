"""Longest-prefix match of a request path to an application's ingress deployment.

A prefix matches the path itself and anything below it at a segment boundary:
"/greet" matches "/greet" and "/greet/x" but not "/greeting"; "/" matches everything.
"""

from __future__ import annotations


class RouteTable:
    def __init__(self, routes: dict[str, str] | None = None) -> None:
        self._routes = dict(routes or {})
        # Longest first, so the first match is the longest one.
        self._ordered = sorted(self._routes.items(), key=lambda kv: -len(kv[0]))

    @property
    def routes(self) -> dict[str, str]:
        return dict(self._routes)

    def __bool__(self) -> bool:
        return bool(self._routes)

    def match(self, path: str) -> tuple[str, str] | None:
        """(route_prefix, deployment key) for the longest matching prefix, or None."""
        for prefix, target in self._ordered:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return prefix, target
        return None
