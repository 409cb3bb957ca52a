"""Spark's Kafka connector, resolved from Maven Central once and cached.

`--packages` would resolve the connector through Ivy on every cold start and needs the
network each time a fresh cache is used; Maven resolves it once into the same cache
folder the local broker uses, after which the audit starts offline. Only jars that the
installed pyspark does not already ship are kept: a second copy of Hadoop, Scala or an
older slf4j on the classpath is the classic source of `NoSuchMethodError` at run time.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path

from delayservice.audit import INSTALL_EXTRA, AuditError
from delayservice.kafka import maven
from delayservice.kafka.maven import cache_dir

log = logging.getLogger(__name__)

CONNECTOR_GROUP = "org.apache.spark"
CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"

# `dependency:list` lines: group:artifact:type[:classifier]:version:scope[ -- module ...]
_LISTED = re.compile(
    r"^\s*(?P<group>[\w.\-]+):(?P<artifact>[\w.\-]+):jar(?::[\w.\-]+)?:(?P<version>[\w.\-]+)"
    r":(?:compile|runtime)\b"
)


def pyspark_version() -> str:
    try:
        import pyspark  # optional extra, heavy: import only when auditing
    except ImportError as exc:
        raise AuditError(f"pyspark is not installed; {INSTALL_EXTRA}") from exc
    return str(pyspark.__version__)


def pyspark_jars_dir() -> Path:
    import pyspark  # see pyspark_version

    return Path(pyspark.__file__).parent / "jars"


def jars_dir(version: str) -> Path:
    return cache_dir() / f"spark-{version}" / "jars"


def provided_by_pyspark(artifact: str, shipped: list[str]) -> bool:
    """True when pyspark already ships some version of `artifact` (a Maven artifact id)."""
    pattern = re.compile(re.escape(artifact) + r"-\d[^/]*\.jar")
    return any(pattern.fullmatch(name) for name in shipped)


def needed_jars(listing: str, shipped: list[str]) -> list[str]:
    """File names, as copy-dependencies writes them, of the listed jars pyspark lacks."""
    names = []
    for line in listing.splitlines():
        match = _LISTED.match(line)
        if match and not provided_by_pyspark(match["artifact"], shipped):
            names.append(f"{match['artifact']}-{match['version']}.jar")
    return sorted(set(names))


def connector_jars(version: str | None = None) -> list[Path]:
    """The connector's classpath for `version` (default: the installed pyspark's)."""
    version = version or pyspark_version()
    target = jars_dir(version)
    marker = target / ".complete"
    if not marker.exists():
        _resolve(version, target)
        marker.write_text(version)
    jars = sorted(target.glob("*.jar"))
    if not any(j.name.startswith(CONNECTOR_ARTIFACT) for j in jars):
        raise AuditError(f"{target} holds no {CONNECTOR_ARTIFACT} jar; delete the folder and retry")
    return jars


def _resolve(version: str, target: Path) -> None:
    log.info(
        "resolving %s:%s:%s from Maven Central into %s",
        CONNECTOR_GROUP,
        CONNECTOR_ARTIFACT,
        version,
        target,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="connector-") as tmp:
        listing = Path(tmp) / "dependencies.txt"
        copied = Path(tmp) / "jars"
        try:
            maven.resolve([f"{CONNECTOR_GROUP}:{CONNECTOR_ARTIFACT}:{version}"], copied, listing)
        except maven.MavenError as exc:
            raise AuditError(
                f"no {CONNECTOR_ARTIFACT}:{version} (the connector for the installed pyspark) "
                "could be resolved; install a pyspark whose connector Maven Central has "
                f"(pip install 'pyspark==<that version>').\n{exc}"
            ) from exc
        shipped = sorted(p.name for p in pyspark_jars_dir().glob("*.jar"))
        wanted = needed_jars(listing.read_text(), shipped)
        if target.exists():
            shutil.rmtree(target)
        target.mkdir()
        for name in wanted:
            shutil.copy2(copied / name, target / name)
