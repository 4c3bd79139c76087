"""What the CLI prints for an error: one ``error:`` line per problem and the documented exit
code; the traceback only with ``--verbose`` (before or after the command). Nothing here
starts Ray."""

from __future__ import annotations

import io
import signal
import socket

import pytest

from controlplane.errors import (BuildError, BuildErrors, ConfigError, DeployRejected,
                                 NoInstance)
from fleetplane import cli
from fleetplane.cli_errors import EXIT_BAD_CONFIG, EXIT_FAILED, report


def reported(error: Exception, *, verbose: bool = False, refused: bool = True) -> tuple:
    stream = io.StringIO()
    code = report(error, stream, verbose=verbose, refused=refused)
    return code, stream.getvalue()


def raised(error: Exception) -> Exception:
    """``error`` with a traceback, as main() catches it."""
    try:
        raise error
    except Exception as e:
        return e


def test_bad_user_code_is_one_line_then_nothing_was_changed_exit_1():
    error = BuildError("shop", "import_path 'a.b:c': module 'a.b' not found")
    assert reported(error) == (EXIT_FAILED, "error: application 'shop': import_path 'a.b:c': "
                                            "module 'a.b' not found\nnothing was changed.\n")


def test_the_users_traceback_is_behind_verbose_and_the_line_says_so():
    error = BuildError("shop", "import_path 'm:A': importing module 'm' raised ValueError: x",
                       "Traceback (most recent call last):\n  File \"m.py\", line 1\n"
                       "ValueError: x\n")
    code, text = reported(error)
    assert text == ("error: application 'shop': import_path 'm:A': importing module 'm' "
                    "raised ValueError: x (--verbose shows the traceback)\n"
                    "nothing was changed.\n")
    code, text = reported(error, verbose=True)
    assert text == ("Traceback (most recent call last):\n  File \"m.py\", line 1\nValueError: x"
                    "\nerror: application 'shop': import_path 'm:A': importing module 'm' "
                    "raised ValueError: x\nnothing was changed.\n")


def test_several_applications_failing_are_a_line_each():
    error = BuildErrors([BuildError("a", "import_path 'x:A': module 'x' not found"),
                         BuildError("b", "runtime_env: /nope is not a valid path.")])
    code, text = reported(error)
    assert code == EXIT_FAILED
    assert text.splitlines() == ["error: application 'a': import_path 'x:A': module 'x' not "
                                 "found", "error: application 'b': runtime_env: /nope is not "
                                 "a valid path.", "nothing was changed."]


def test_an_embedded_run_that_stopped_does_not_claim_nothing_was_changed():
    code, text = reported(BuildError("shop", "boom"), refused=False)
    assert (code, text) == (EXIT_FAILED, "error: application 'shop': boom\n")


def test_a_refused_deploy_says_nothing_was_changed():
    code, text = reported(DeployRejected("num_shards cannot change"))
    assert (code, text) == (EXIT_FAILED, "error: num_shards cannot change\n"
                                         "nothing was changed.\n")


def test_an_invalid_config_exits_2():
    code, text = reported(ConfigError("x.yaml", ["applications[0].name: bad"]))
    assert code == EXIT_BAD_CONFIG
    assert text.endswith("  - applications[0].name: bad\nnothing was changed.\n")


def test_an_unexpected_error_is_one_line_its_stack_behind_verbose():
    error = raised(KeyError("shards"))
    code, text = reported(error, refused=False)
    assert (code, text) == (EXIT_FAILED,
                            "error: KeyError: 'shards' (--verbose shows the traceback)\n")
    code, text = reported(error, verbose=True, refused=False)
    assert text.startswith("Traceback (most recent call last):\n")
    assert text.endswith("KeyError: 'shards'\nerror: KeyError: 'shards'\n")


def test_an_expected_error_needs_no_hint():
    code, text = reported(raised(NoInstance("no Ray cluster answers")), refused=False)
    assert (code, text) == (EXIT_FAILED, "error: no Ray cluster answers\n")


# ---- --verbose on the command line ---------------------------------------------------------

@pytest.fixture
def config_and_dead_address(tmp_path) -> tuple[str, str]:
    config = tmp_path / "ok.yaml"
    config.write_text("applications:\n  - name: shop\n    import_path: a.b:C\n")
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return str(config), f"127.0.0.1:{port}"


@pytest.mark.parametrize("where", ["before", "after", "absent"])
def test_verbose_goes_before_or_after_the_command(where, config_and_dead_address, capsys):
    config, address = config_and_dead_address
    argv = ["deploy", config, "--address", address]
    argv = {"before": ["--verbose", *argv], "after": [*argv, "--verbose"], "absent": argv}[where]
    assert cli.main(argv) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"error: no Ray cluster answers at {address}")
    assert ("Traceback (most recent call last)" in err) == (where != "absent")


def test_nested_and_other_commands_take_verbose_too(config_and_dead_address, capsys):
    config, address = config_and_dead_address
    assert cli.main(["k8s", "render", "missing.yaml", "--verbose"]) == EXIT_BAD_CONFIG
    assert cli.main(["status", "--address", address, "--verbose"]) == EXIT_FAILED
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_second_stop_signal_is_ignored_once_the_run_is_stopping(monkeypatch):
    installed = {}
    monkeypatch.setattr(cli.signal, "signal", lambda signum, handler: installed.update(
        {signum: handler}))
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGINT, None)
    assert installed == {s: signal.SIG_IGN for s in cli._STOP_SIGNALS}
