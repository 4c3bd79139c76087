"""Longest-prefix match of a request path to an application's ingress deployment: the one
rule of both front doors (a proxy's table of every route, a direct-ingress replica's table
of its own route).

A prefix matches the path itself and anything below it at a segment boundary:
"/greet" matches "/greet" and "/greet/x" but not "/greeting"; "/" matches everything.
The config refuses a prefix with a trailing slash (``config.bounds.route_prefix_problem``);
one that reaches a table anyway ("/greet/") matches as "/greet" does.

``match`` runs per request: each route's two comparands are made once, with the table.
"""

from __future__ import annotations


def _comparands(prefix: str) -> tuple[str, str]:
    """(the path the prefix names, the start of every path below it); "/" has no bare form."""
    bare = prefix.rstrip("/") or "/"
    return bare, "/" if bare == "/" else bare + "/"


def prefix_matches(prefix: str, path: str) -> bool:
    """Whether ``path`` is ``prefix`` or below it, at a segment boundary."""
    bare, below = _comparands(prefix)
    return path == bare or path.startswith(below)


class RouteTable:
    def __init__(self, routes: dict[str, str] | None = None) -> None:
        self._routes = dict(routes or {})
        # Longest first, so the first match is the longest one.
        self._ordered = [(prefix, target, *_comparands(prefix)) for prefix, target in
                         sorted(self._routes.items(), key=lambda kv: -len(kv[0]))]

    @property
    def routes(self) -> dict[str, str]:
        return dict(self._routes)

    def __bool__(self) -> bool:
        return bool(self._routes)

    def match(self, path: str) -> tuple[str, str] | None:
        """(route_prefix, deployment key) for the longest matching prefix, or None."""
        for prefix, target, bare, below in self._ordered:
            if path == bare or path.startswith(below):  # prefix_matches, inlined
                return prefix, target
        return None
