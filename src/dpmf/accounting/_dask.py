"""Connecting to a Dask cluster (MMCC rows, Monte Carlo chunks): ``distributed`` is imported only
here and only when a ``scheduler`` is given; a bad address or an unreachable scheduler is one
:class:`~dpmf.errors.InvalidParameterError` naming it, not a traceback from inside Dask."""

from __future__ import annotations

from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError

#: How long to wait for a scheduler before giving up.
CONNECT_TIMEOUT = "10s"


def connect(scheduler) -> tuple[object, bool]:
    """``(client, own)``: a ``distributed.Client`` for ``scheduler`` (an address such as
    ``"tcp://host:8786"``, or a client, then ``own`` is False and the caller must not close it)."""
    try:
        import distributed
    except ImportError:  # pragma: no cover - depends on the environment
        raise UnsupportedConfigurationError(
            "scheduler was given but Dask is not installed; install the optional extra "
            "(pip install 'dask[distributed]') or use workers=N for local processes"
        ) from None
    if isinstance(scheduler, distributed.Client):
        return scheduler, False
    if not isinstance(scheduler, str) or not scheduler.strip():
        raise InvalidParameterError(
            f"scheduler must be a Dask scheduler address (str) or a distributed.Client, got {scheduler!r}"
        )
    try:
        return distributed.Client(scheduler, timeout=CONNECT_TIMEOUT), True
    except Exception as exc:  # noqa: BLE001 - any failure to connect is the address's fault
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidParameterError(
            f"scheduler {scheduler!r}: cannot connect to a Dask scheduler ({reason[:200]})"
        ) from None
