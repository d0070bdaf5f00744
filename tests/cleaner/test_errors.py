"""One root for the cleaner's exceptions: every exception class of `cleaner/` derives from `CleanerError`.

The test walks every module of the package, so a new error class outside the root fails it; each class keeps
the builtin base its callers catch (`ValueError`, `RuntimeError`); and the CLI turns a `CleanerError` no
command caught into one line, never a traceback.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import cleaner
from cleaner.cli import main
from cleaner.errors import CleanerError

# Exception classes of cleaner/ outside the root, each with why. click's own errors are shown by click.
OUTSIDE_THE_ROOT = {
    "cleaner.cli_support.OneLineUsageError": "a click.UsageError: click shows it (exit 2)",
    "cleaner.cli._Terminated": "SIGTERM as a BaseException, like KeyboardInterrupt: a signal, not an error",
}

# The builtin base each error keeps, for the callers that catch it by that base.
BUILTIN_BASES = {
    "cleaner.admin_token.AdminTokenError": ValueError,
    "cleaner.config_file.ConfigFileError": ValueError,
    "cleaner.daemon.DaemonStartError": RuntimeError,
    "cleaner.manager.StateError": RuntimeError,
    "cleaner.policy.PolicyError": ValueError,
    "cleaner.round.CleaningAbortedError": Exception,
    "cleaner.safety.SafetyCheckError": RuntimeError,
    "cleaner.settings.SettingError": ValueError,
}


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of `cleaner/`, by qualified name."""
    found = {}
    for info in pkgutil.walk_packages(cleaner.__path__, "cleaner."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == module.__name__ and issubclass(obj, BaseException):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def test_every_exception_class_of_the_cleaner_derives_from_the_root():
    classes = _exception_classes()
    assert set(BUILTIN_BASES) <= set(classes), "the walk must see the known errors"
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, CleanerError) and name not in OUTSIDE_THE_ROOT)
    assert outside == [], f"exception classes of cleaner/ not derived from cleaner.errors.CleanerError: {outside}"
    assert set(OUTSIDE_THE_ROOT) <= set(classes), "an exemption names a class that is gone"


@pytest.mark.parametrize("name", sorted(BUILTIN_BASES))
def test_each_error_keeps_the_builtin_base_its_callers_catch(name):
    cls = _exception_classes()[name]
    assert issubclass(cls, CleanerError) and issubclass(cls, BUILTIN_BASES[name])


def test_the_root_is_exported_and_sits_at_the_bottom():
    assert cleaner.CleanerError is CleanerError
    tree = ast.parse(Path(inspect.getfile(CleanerError)).read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports), \
        "cleaner/errors.py imports nothing, so every module of cleaner/ may import it"


def test_a_cleaner_error_no_command_caught_is_one_line_and_no_traceback(tmp_path, monkeypatch):
    from cleaner import config_file
    from cleaner.safety import SafetyCheckError

    def failing(*args, **kwargs):
        raise SafetyCheckError("t-0: something went wrong\nacross two lines")

    monkeypatch.setattr(config_file, "load_config", failing)  # `clean` catches only ConfigFileError from it
    result = CliRunner().invoke(main, ["clean", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no exception escaped: no traceback
    assert result.output.splitlines() == ["Error: t-0: something went wrong across two lines"]
