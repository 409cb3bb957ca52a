"""Resolve jars from Maven Central into a folder, with the machine's `mvn`.

Both the local Kafka broker and Spark's Kafka connector come this way: one throwaway
POM lists the coordinates, and `dependency:copy-dependencies` copies the runtime
classpath. Callers cache the folder, so only the first run needs the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from delayservice.errors import DelayServiceError

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>delayservice.local</groupId><artifactId>resolve</artifactId><version>1</version>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""
_DEPENDENCY = (
    "    <dependency><groupId>{0}</groupId><artifactId>{1}</artifactId>"
    "<version>{2}</version></dependency>"
)


class MavenError(DelayServiceError):
    """mvn is missing or could not resolve the coordinates; the output tail says why."""


def resolve(coordinates: list[str], output: Path, listing: Path | None = None) -> None:
    """Copy the runtime classpath of `group:artifact:version` coordinates into `output`.

    With `listing`, also write `dependency:list` there (group:artifact:type:version:scope).
    """
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError("Maven (mvn) is needed to fetch jars from Maven Central")
    parts = [c.split(":") for c in coordinates]
    if any(len(p) != 3 for p in parts):
        raise ValueError(f"coordinates must be group:artifact:version, got {coordinates}")
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix="resolve-") as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(_POM.format(dependencies="\n".join(_DEPENDENCY.format(*p) for p in parts)))
        goals = ["dependency:copy-dependencies"]
        if listing is not None:
            goals = ["dependency:list", *goals, f"-DoutputFile={listing}"]
        result = subprocess.run(
            [mvn, "-q", "-B", "-U", "-f", str(pom), *goals,
             f"-DoutputDirectory={output}", "-DincludeScope=runtime"],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    if result.returncode != 0:
        raise MavenError(
            f"mvn could not resolve {', '.join(coordinates)}:\n{result.stdout[-2000:]}"
        )


def cache_dir() -> Path:
    """Where resolved jars are kept between runs (`XDG_CACHE_HOME` honoured)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "delayservice"
