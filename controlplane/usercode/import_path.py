"""An application's ``import_path`` resolved to the object it names, or one line saying why
not (raised as ``BuildError`` naming the application and ``import_path``).

Three ways it fails, told apart because each has a different fix:
- the module (or a package above it) does not exist: "module 'a.b' not found";
- the module exists but raises while importing (a missing dependency, a syntax error, its
  own code): "importing module 'a.b' raised <Type>: <the exception's message>", with the
  user's traceback as the error's ``detail`` (``fleetplane --verbose`` shows it);
- an attribute along the path does not exist: "module 'a.b' has no attribute 'c'".

The path's form (``pkg.module:attr`` or ``pkg.module.attr``) is the config schema's to
check; here it is split the same way.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from typing import Any

from controlplane.errors import BuildError, exception_line


def split_import_path(import_path: str) -> tuple[str, list[str]]:
    """``("pkg.module", ["Attr", "inner"])`` for ``pkg.module:Attr.inner`` (or the dotted
    form, whose last part is the attribute)."""
    if ":" in import_path:
        module_name, attr = import_path.split(":", 1)
    else:
        module_name, _, attr = import_path.rpartition(".")
    return module_name, attr.split(".")


def import_target(app: str, import_path: str) -> Any:
    """The object ``import_path`` names; ``BuildError`` in one line when there is none."""
    module_name, attrs = split_import_path(import_path)
    where = f"import_path '{import_path}'"
    module = _import_module(app, where, module_name)
    value = module
    for i, part in enumerate(attrs):
        owner = f"module '{module_name}'" if i == 0 else \
            f"'{module_name}:{'.'.join(attrs[:i])}'"
        try:
            value = getattr(value, part)
        except AttributeError:
            raise BuildError(app, f"{where}: {owner} has no attribute '{part}'") from None
        except Exception as e:  # a module __getattr__ or a property that raises
            raise BuildError(app, f"{where}: getting '{part}' from {owner} raised "
                             f"{exception_line(e)}", traceback.format_exc()) from None
    return value


def _import_module(app: str, where: str, module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if _names_the_path(e.name, module_name):  # not a missing import inside it
            missing = "" if e.name == module_name else f" (no module named '{e.name}')"
            raise BuildError(app, f"{where}: module '{module_name}' not found{missing}; "
                             f"check the name, and that the module is installed on the "
                             f"cluster or shipped in runtime_env") from None
        error: BaseException = e
    except (Exception, SystemExit) as e:  # the user's module raised while importing
        error = e
    raise BuildError(app, f"{where}: importing module '{module_name}' raised "
                     f"{exception_line(error)}", _user_traceback(error)) from None


def _names_the_path(missing: str | None, module_name: str) -> bool:
    """Is the missing module ``module_name`` itself or a package above it?"""
    return missing is not None and (missing == module_name
                                    or module_name.startswith(missing + "."))


def _user_traceback(error: BaseException) -> str:
    """The traceback from the user's first frame on: importlib's own frames say nothing."""
    tb = error.__traceback__
    while tb is not None and _is_import_machinery(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb or error.__traceback__))


def _is_import_machinery(filename: str) -> bool:
    return filename.startswith("<frozen importlib") or filename in (
        __file__, getattr(sys.modules.get("importlib"), "__file__", None))
