"""Command-line options of the test suite, and how Hypothesis draws.

`--soak-seconds N` (or the environment variable `LOGCLEANER_SOAK_SECONDS`) sets how long the soak test
(`tests/integration/test_soak.py`) keeps its writer, cleaner and readers running; without either it runs for
its CI length of about a minute. The soak's timeout grows with it.

Hypothesis draws the same examples every run (profile "ci", derandomized), so a run is red only because of a
change; `LOGCLEANER_HYPOTHESIS=explore` draws new ones each run, to look for bugs (a find becomes an
`@example` of its property).

The processes the tests start get the default action of the stop signals, whatever the suite was started under:
a suite under `nohup` (SIGHUP ignored) or as a background job of a script (SIGINT and SIGQUIT ignored) would
otherwise pass the ignored signals on, and a test that stops a command as a terminal does would see it go on
(`logcleaner clean` keeps an ignored SIGHUP or SIGINT ignored, as it should). The suite itself goes on ignoring
them. A test that wants a command under `nohup` ignores SIGHUP around its start.
"""

from __future__ import annotations

import os
import signal

import pytest
from hypothesis import settings as hypothesis_settings

hypothesis_settings.register_profile("ci", derandomize=True)
hypothesis_settings.register_profile("explore", derandomize=False)
hypothesis_settings.load_profile(os.environ.get("LOGCLEANER_HYPOTHESIS", "ci"))

SOAK_SECONDS_DEFAULT = 60.0
SOAK_SECONDS_ENV = "LOGCLEANER_SOAK_SECONDS"
SOAK_TIMEOUT_OVERHEAD_S = 240.0  # start-up, the final cleaning and the checks, generously


_STOP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM, signal.SIGTSTP)


def _ignore(signum: int, frame: object) -> None:
    """Ignores a stop signal in this process, where an exec'd child gets the default action (a handled signal is
    reset on exec, an ignored one stays ignored)."""


def pytest_configure(config: pytest.Config) -> None:
    for signum in _STOP_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_IGN:
            signal.signal(signum, _ignore)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help=f"seconds of concurrent writing, cleaning and reading in the soak test "
             f"(default: ${SOAK_SECONDS_ENV} or {SOAK_SECONDS_DEFAULT:g})",
    )


def _soak_seconds_of(config: pytest.Config) -> float:
    """The soak length: the option, else the environment variable, else the CI default."""
    value = config.getoption("--soak-seconds")
    if value is None:
        text = os.environ.get(SOAK_SECONDS_ENV, "").strip()
        value = float(text) if text else SOAK_SECONDS_DEFAULT
    if value <= 0:
        raise pytest.UsageError(f"the soak length must be positive, got {value:g} s")
    return value


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A longer soak must not be cut short by the suite's default timeout.
    seconds = _soak_seconds_of(config)
    for item in items:
        if "soak_seconds" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(seconds + SOAK_TIMEOUT_OVERHEAD_S))


@pytest.fixture
def soak_seconds(request: pytest.FixtureRequest) -> float:
    """Seconds of concurrent activity in the soak test (`--soak-seconds`, `$LOGCLEANER_SOAK_SECONDS`, 60)."""
    return _soak_seconds_of(request.config)


def pytest_sessionstart(session: pytest.Session) -> None:
    # The kernels' module is built (once per installation and machine, `cleaner.kernel_cache`) before any test
    # imports a kernel module, so that the suite runs the kernels the product runs: the built module, and
    # numba's JIT only where a test calls a kernel with arguments the module was not built for.
    # On a fresh installation that build is a first `logcleaner clean`, observed for its own test
    # (`tests/first_clean.py`): the suite pays for one build, not two.
    from cleaner import kernel_cache
    from tests import first_clean

    first_clean.observe_if_first(session.config)
    kernel_cache.ensure_compiled()
