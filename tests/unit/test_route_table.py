"""Longest-prefix matching at segment boundaries."""

from controlplane.routing.route_table import RouteTable


def test_longest_prefix_wins_at_segment_boundaries():
    table = RouteTable({"/": "root/App", "/api": "api/Api", "/api/v2": "v2/Api"})
    assert table.match("/api/v2/models") == ("/api/v2", "v2/Api")
    assert table.match("/api/v2") == ("/api/v2", "v2/Api")
    assert table.match("/api/v20") == ("/api", "api/Api")
    assert table.match("/apis") == ("/", "root/App")
    assert table.match("/") == ("/", "root/App")


def test_no_match_without_a_root_route():
    table = RouteTable({"/greet": "greeter/Greeter"})
    assert table.match("/greeting") is None
    assert table.match("/") is None
    assert table.match("/greet/x") == ("/greet", "greeter/Greeter")
    assert not RouteTable() and table
