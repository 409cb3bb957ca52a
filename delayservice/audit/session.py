"""The SparkSession the audit runs in, sized for a small machine unless told otherwise.

Defaults fit a 2-core box beside a broker: two local threads, a few shuffle partitions
(the data of one audit is small next to Spark's default of 200, which would mostly
schedule empty tasks) and a 1 GiB driver. Every default yields to `--master` and
`--conf`, so the same job runs on a cluster with that cluster's usual settings.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from delayservice.audit import INSTALL_EXTRA, AuditError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
DEFAULTS: Mapping[str, str] = {
    "spark.driver.memory": "1g",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.debug.maxToStringFields": "200",
}


def spark_conf(
    jars: list[Path], overrides: Mapping[str, str], *, show_progress: bool
) -> dict[str, str]:
    """Defaults, then the connector jars (added to any the user passes), then overrides."""
    conf = dict(DEFAULTS)
    conf["spark.ui.showConsoleProgress"] = "true" if show_progress else "false"
    conf.update(overrides)
    paths = [str(j) for j in jars]
    if overrides.get("spark.jars"):
        paths.append(overrides["spark.jars"])
    conf["spark.jars"] = ",".join(paths)
    return conf


def require_extras() -> None:
    """Fail before any work when the `audit` extra is missing, not at the plot at the end."""
    missing = [name for name in ("pyspark", "matplotlib") if importlib.util.find_spec(name) is None]
    if missing:
        raise AuditError(f"{' and '.join(missing)} not installed; {INSTALL_EXTRA}")


def start(
    master: str | None, conf: Mapping[str, str], app_name: str = "delayservice-audit"
) -> SparkSession:
    """Start a SparkSession; fails with one clear line when Java is absent."""
    if shutil.which("java") is None:
        raise AuditError("Java (17 or newer) is needed to run the audit on Spark")
    from pyspark.sql import SparkSession  # heavy: only when auditing

    builder = SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
    for key, value in conf.items():
        builder = builder.config(key, value)
    log.debug("starting Spark (%s) with %s", master or DEFAULT_MASTER, conf)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise AuditError(f"Spark did not start: {exc}") from exc
    spark.sparkContext.setLogLevel("WARN")
    return spark


def stderr_is_terminal() -> bool:
    return sys.stderr.isatty()
