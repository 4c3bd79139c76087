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


def test_a_trailing_slash_matches_as_without_it_in_the_table_and_alone():
    """The config refuses one; a prefix that reaches a table anyway is not a stricter
    rule (both front doors once differed here: one needed "/greet//x")."""
    from controlplane.routing.route_table import prefix_matches

    table = RouteTable({"/greet/": "greeter/Greeter"})
    for path in ("/greet", "/greet/", "/greet/x"):
        assert table.match(path) == ("/greet/", "greeter/Greeter")
        assert prefix_matches("/greet/", path) and prefix_matches("/greet", path)
    assert table.match("/greeting") is None and not prefix_matches("/greet/", "/greeting")
    assert prefix_matches("/", "/anything")
