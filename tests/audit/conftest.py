"""A local SparkSession for the audit tests.

One session serves every test: starting a JVM costs seconds, running a query on ten
rows costs milliseconds. It is sized like the audit's own default (local[2], few
shuffle partitions) so the tests exercise the same plans. Under CI=true a missing
pyspark or Java fails the run instead of skipping it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def no_spark(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"the audit tests need Spark: {reason}", pytrace=False)
    pytest.skip(f"no Spark: {reason}")


@pytest.fixture(scope="session")
def spark_available() -> None:
    """Fails under CI, skips elsewhere, when the audit cannot run here at all."""
    if importlib.util.find_spec("pyspark") is None:
        no_spark("pyspark is not installed (pip install -e '.[audit]')")
    if importlib.util.find_spec("matplotlib") is None:
        no_spark("matplotlib is not installed (pip install -e '.[audit]')")
    if shutil.which("java") is None:
        no_spark("java is not on PATH")


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
