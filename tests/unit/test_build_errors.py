"""Bad user code is one line naming the application and the field, its traceback behind it
(``detail``), before anything is committed: an ``import_path`` that does not import or
names nothing, constructor arguments the class does not take, a builder that raises.

The user modules are written per test under ``tmp_path`` (a module that raises on import
cannot live in the package). Builds run in-process; nothing here starts Ray.
"""

from __future__ import annotations

import pickle
import textwrap

import pytest

from controlplane.config.schema import config_to_dict, parse_deploy_config
from controlplane.errors import BuildError, BuildErrors
from controlplane.usercode.build import build_application

APPS = "tests.unit.sample_apps"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``user_module(name, source)`` writes ``name.py`` where imports find it."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name
    return write


def build_error(import_path: str, **fields) -> BuildError:
    raw = {"name": "shop", "import_path": import_path, **fields}
    app = config_to_dict(parse_deploy_config({"applications": [raw]}))["applications"][0]
    with pytest.raises(BuildError) as caught:
        build_application(app)
    assert caught.value.app == "shop"
    assert "\n" not in caught.value.message  # one line
    return caught.value


# ---- import_path -----------------------------------------------------------------------

def test_a_module_that_does_not_exist_is_named_without_a_traceback():
    error = build_error("no_such_module_here:App")
    assert str(error) == (
        "application 'shop': import_path 'no_such_module_here:App': module "
        "'no_such_module_here' not found; check the name, and that the module is installed "
        "on the cluster or shipped in runtime_env")
    assert error.detail == ""


def test_a_missing_package_above_the_module_is_named_too():
    error = build_error("no_such_package_here.models:App")
    assert "module 'no_such_package_here.models' not found (no module named " \
           "'no_such_package_here')" in error.message


def test_a_module_that_raises_on_import_says_so_with_the_exceptions_last_line(user_module):
    user_module("raises_at_import", """
        import json
        raise ValueError("weights config missing\\nsecond line")
    """)
    error = build_error("raises_at_import:App")
    assert error.message == ("import_path 'raises_at_import:App': importing module "
                             "'raises_at_import' raised ValueError: weights config missing")
    # The traceback starts at the user's frame: importlib's own frames say nothing.
    assert error.detail.startswith("Traceback (most recent call last):\n"
                                   f'  File "{error.detail.split(chr(34))[1]}", line 3')
    assert error.detail.split('"')[1].endswith("raises_at_import.py")
    assert "importlib" not in error.detail


def test_a_missing_dependency_inside_the_module_is_not_called_a_missing_module(user_module):
    user_module("needs_a_dependency", "import a_dependency_nobody_installed\n")
    error = build_error("needs_a_dependency:App")
    assert error.message == (
        "import_path 'needs_a_dependency:App': importing module 'needs_a_dependency' raised "
        "ModuleNotFoundError: No module named 'a_dependency_nobody_installed'")


def test_a_syntax_error_names_the_file_and_line(user_module):
    user_module("bad_syntax", "x = 1\ndef broken(:\n")
    error = build_error("bad_syntax:App")
    assert error.message.startswith(
        "import_path 'bad_syntax:App': importing module 'bad_syntax' raised SyntaxError: ")
    assert "bad_syntax.py, line 2" in error.message


def test_a_module_that_exits_on_import_is_reported_not_obeyed(user_module):
    user_module("exits_at_import", "import sys\nsys.exit(3)\n")
    error = build_error("exits_at_import:App")
    assert error.message.endswith("importing module 'exits_at_import' raised SystemExit: 3")


def test_a_missing_attribute_is_named_with_its_module():
    error = build_error(f"{APPS}:NoSuchApp")
    assert error.message == (f"import_path '{APPS}:NoSuchApp': module '{APPS}' has no "
                             f"attribute 'NoSuchApp'")
    error = build_error(f"{APPS}.NoSuchApp")  # the dotted form
    assert f"module '{APPS}' has no attribute 'NoSuchApp'" in error.message


def test_a_missing_attribute_further_along_names_what_it_was_looked_up_on():
    error = build_error(f"{APPS}:Model.no_such_thing")
    assert error.message.endswith(f"'{APPS}:Model' has no attribute 'no_such_thing'")


def test_a_builder_that_raises_is_one_line_with_its_traceback_behind(user_module):
    user_module("raising_builder", """
        def build(args: dict):
            raise RuntimeError("no GPU on this node")
    """)
    error = build_error("raising_builder:build", args={"size": 1})
    assert error.message == ("import_path 'raising_builder:build': the application builder "
                             "raised RuntimeError: no GPU on this node")
    assert "raising_builder.py" in error.detail and "no GPU" in error.detail


# ---- constructor arguments -------------------------------------------------------------

def test_args_to_a_class_that_takes_none_are_refused_naming_args(user_module):
    user_module("no_args", """
        class Echo:
            def __call__(self, text: str = "") -> str:
                return text
    """)
    error = build_error("no_args:Echo", args={"size": 3})
    assert error.message == (
        "args do not fit Echo(), the constructor of deployment 'Echo': got an unexpected "
        "keyword argument 'size'; fix args in the config")


def test_a_constructor_argument_the_config_does_not_give_is_refused():
    error = build_error(f"{APPS}:Adder")  # Adder(increment)
    assert error.message == (
        "args do not fit Adder(increment), the constructor of deployment 'Adder': "
        "missing a required argument: 'increment'; fix args in the config")


def test_an_unknown_argument_beside_known_ones_is_refused():
    error = build_error(f"{APPS}:Model", args={"greeting": "hi", "sise": 2})
    assert error.message.startswith("args do not fit Model(greeting='hello', size=1)"
                                    ", the constructor of deployment 'Model'")
    assert "unexpected keyword argument 'sise'" in error.message


def test_arguments_bound_in_code_that_do_not_fit_are_refused_naming_bind(user_module):
    user_module("bad_bind", """
        from ray import serve

        class Adder:
            def __init__(self, increment: int) -> None:
                self.increment = increment

        app = serve.deployment(Adder).bind(1, 2)
    """)
    error = build_error("bad_bind:app")
    assert error.message == (
        "the arguments bound in code (.bind(...)) do not fit Adder(increment), the "
        "constructor of deployment 'Adder': too many positional arguments; fix the "
        ".bind(...) call")


def test_an_unbound_deployment_gets_no_arguments_so_required_ones_are_refused(user_module):
    user_module("unbound", """
        from ray import serve

        @serve.deployment
        class Greeter:
            def __init__(self, text: str) -> None:
                self.text = text
    """)
    error = build_error("unbound:Greeter")
    assert error.message == (
        "no arguments (import_path names a Serve deployment that is not bound) do not fit "
        "Greeter(text), the constructor of deployment 'Greeter': missing a required "
        "argument: 'text'; point import_path at serve.deployment(Cls).bind(...)")


def test_a_class_a_builder_returns_gets_no_arguments_so_required_ones_are_refused(user_module):
    user_module("class_builder", f"""
        from {APPS} import Adder

        def build(args: dict):
            return Adder
    """)
    error = build_error("class_builder:build", args={"increment": 1})
    assert error.message.startswith("no arguments (a class an application builder returns "
                                    "gets none) do not fit Adder(increment)")


def test_a_class_without_a_readable_signature_is_left_to_the_replica(user_module):
    user_module("c_type", "from collections import OrderedDict as Table\n")
    raw = {"name": "shop", "import_path": "c_type:Table", "args": {"a": 1}}
    app = config_to_dict(parse_deploy_config({"applications": [raw]}))["applications"][0]
    assert len(build_application(app)) == 1  # OrderedDict(**kwargs) takes them


# ---- the errors themselves -------------------------------------------------------------

def test_build_errors_pickle_with_their_fields_and_traceback():
    error = pickle.loads(pickle.dumps(BuildError("shop", "import_path 'a:b': boom", "tb")))
    assert (error.app, error.message, error.detail) == ("shop", "import_path 'a:b': boom", "tb")
    assert str(error) == "application 'shop': import_path 'a:b': boom"
    assert error.by_application() == [error]


def test_several_applications_failing_are_one_error_per_application():
    several = BuildErrors([BuildError("a", "one", "tb-a"), BuildError("b", "two")])
    again = pickle.loads(pickle.dumps(several))
    assert isinstance(again, BuildError) and again.app == "a, b"
    assert [str(e) for e in again.by_application()] == ["application 'a': one",
                                                        "application 'b': two"]
    assert str(again) == "application 'a': one\napplication 'b': two"
    assert again.detail == "[a]\ntb-a"
