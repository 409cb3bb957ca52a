"""A local SparkSession for the audit tests.

One session serves every test: starting a JVM costs seconds, running a query on ten
rows costs milliseconds. It is sized like the audit's own default (local[2], few
shuffle partitions) so the tests exercise the same plans. Under CI=true a missing
pyspark or Java fails the run instead of skipping it.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest


@pytest.fixture(scope="session")
def spark_available(unavailable: Callable[[str], NoReturn]) -> None:
    """Fails under CI, skips elsewhere, when the audit cannot run here at all."""
    if importlib.util.find_spec("pyspark") is None:
        unavailable("the audit tests need pyspark (pip install -e '.[audit]')")
    if importlib.util.find_spec("matplotlib") is None:
        unavailable("the audit tests need matplotlib (pip install -e '.[audit]')")
    if shutil.which("java") is None:
        unavailable("the audit tests need java on PATH")


@pytest.fixture(scope="session")
def spark(spark_available: None) -> Iterator[Any]:
    from pyspark.sql import SparkSession  # only once pyspark is known to be there

    session = (
        SparkSession.builder.master("local[2]")
        .appName("delayservice-audit-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
