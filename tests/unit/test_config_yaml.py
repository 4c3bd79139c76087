"""Deploy config files that must be refused before they are expanded or built (issue 15)."""

from __future__ import annotations

import pytest

from controlplane.config.schema import load_deploy_config
from controlplane.config.yaml_file import MAX_CONFIG_BYTES, read_yaml_file
from controlplane.errors import ConfigError

GOOD = """
applications:
  - name: a
    route_prefix: /a
    import_path: tests.unit.sample_apps:app
"""


def refusal(tmp_path, text: str | bytes) -> str:
    path = tmp_path / "deploy.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as info:
        read_yaml_file(str(path))
    [line] = info.value.errors
    return str(line)


def test_a_duplicate_key_names_the_key_and_both_lines(tmp_path):
    text = "applications:\n  - name: a\n    route_prefix: /a\n    name: b\n"
    message = refusal(tmp_path, text)
    assert "duplicate key 'name' (first at line 2) at line 4" in message


def test_a_duplicate_top_level_key_is_refused_too(tmp_path):
    assert "duplicate key 'applications'" in refusal(tmp_path, GOOD + GOOD)


def test_anchors_and_merge_keys_of_a_normal_config_are_fine(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text("base: &base {num_cpus: 0}\nx: {<<: *base, num_cpus: 1}\ny: *base\n")
    assert read_yaml_file(str(path)) == {"base": {"num_cpus": 0}, "x": {"num_cpus": 1},
                                         "y": {"num_cpus": 0}}


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    assert "alias bomb" in refusal(tmp_path, "\n".join(lines) + "\n")


def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path):
    assert "nested deeper than" in refusal(tmp_path, "[" * 5000 + "]" * 5000 + "\n")
    assert "nested deeper than" in refusal(tmp_path, "a:\n" + "".join(
        " " * i + "b:\n" for i in range(1, 300)))


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    message = refusal(tmp_path, b"# " + b"x" * MAX_CONFIG_BYTES + b"\n")
    assert "over 1024 KiB" in message


def test_a_file_cut_short_says_where(tmp_path):
    message = refusal(tmp_path, 'applications:\n  - name: "a\n')
    assert "invalid YAML at line" in message


def test_load_deploy_config_uses_the_strict_reader(tmp_path):
    path = tmp_path / "deploy.yaml"
    path.write_text(GOOD + "applications: []\n")
    with pytest.raises(ConfigError, match="duplicate key 'applications'"):
        load_deploy_config(str(path))


def test_numbers_with_an_exponent_are_numbers_as_in_yaml_1_2(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1e-09\nb: 5e3\nc: 1.5e3\nd: 12\ne: 1e\nf: v1e5\n")
    assert read_yaml_file(str(path)) == {"a": 1e-09, "b": 5000.0, "c": 1500.0, "d": 12,
                                         "e": "1e", "f": "v1e5"}
