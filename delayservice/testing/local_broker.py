"""A real single-node Apache Kafka broker (KRaft) built from Maven Central artifacts.

The demo, the integration tests and the benchmarks need a real broker, and these
machines have Java and Maven but no container engine. The broker's jars are resolved
once with `mvn dependency:copy-dependencies` into a cache folder; each start formats a
fresh log dir and runs `kafka.Kafka` in combined broker+controller mode on loopback.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from delayservice.errors import DelayServiceError
from delayservice.kafka import maven
from delayservice.kafka.maven import cache_dir
from delayservice.ports import free_ports

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"

_LOG4J2 = """<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="${sys:kafka.logs.dir}/server.log">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="file"/></Root>
    <Logger name="kafka.coordinator" level="WARN"/>
    <Logger name="org.apache.kafka.storage" level="WARN"/>
  </Loggers>
</Configuration>
"""


def ensure_jars(version: str = KAFKA_VERSION) -> Path:
    """Resolve the broker's classpath into the cache (first call only) and return it."""
    libs = cache_dir() / f"kafka-{version}" / "libs"
    marker = libs / ".complete"
    if marker.exists():
        return libs
    log.info("resolving Apache Kafka %s jars from Maven Central into %s", version, libs)
    maven.resolve(
        [
            f"org.apache.kafka:kafka_2.13:{version}",
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        ],
        libs,
    )
    marker.write_text(version)
    return libs


class LocalBroker:
    """Start with `with LocalBroker() as broker:`; `broker.bootstrap` is its address."""

    def __init__(
        self,
        *,
        version: str = KAFKA_VERSION,
        heap: str = "768m",
        extra_properties: dict[str, str] | None = None,
    ) -> None:
        self.version = version
        self.heap = heap
        self.extra = extra_properties or {}
        self.port, self.controller_port = free_ports(2)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._jvm: list[str] = []

    def _properties(self, data: Path) -> str:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(data),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            **self.extra,
        }
        return "".join(f"{k}={v}\n" for k, v in props.items())

    def start(self, timeout: float = 120.0) -> LocalBroker:
        libs = ensure_jars(self.version)
        java = shutil.which("java")
        if java is None:
            raise DelayServiceError("Java is needed to run the local Kafka broker")
        self.workdir = Path(tempfile.mkdtemp(prefix="delayservice-kafka-"))
        config = self.workdir / "server.properties"
        config.write_text(self._properties(self.workdir / "data"))
        (self.workdir / "log4j2.xml").write_text(_LOG4J2)
        self._jvm = [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dkafka.logs.dir={self.workdir}",
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.xml'}",
            "-cp",
            f"{libs}/*",
        ]
        cluster_id = self._storage_tool("random-uuid").split()[-1]
        self._storage_tool("format", "-t", cluster_id, "-c", str(config))
        self._launch(timeout)
        return self

    def _storage_tool(self, *args: str) -> str:
        """Kafka's StorageTool's output; what it printed when it fails, in the error."""
        done = subprocess.run(
            [*self._jvm, "kafka.tools.StorageTool", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()[-20:]
            raise DelayServiceError(
                f"Kafka's StorageTool {args[0]} exited {done.returncode} in {self.workdir}: "
                + ("\n".join(said) or "(it printed nothing)")
            )
        return done.stdout

    def _launch(self, timeout: float) -> None:
        assert self.workdir is not None
        out = (self.workdir / "stdout.log").open("ab")
        self._process = subprocess.Popen(
            [*self._jvm, "kafka.Kafka", str(self.workdir / "server.properties")],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        log.info(
            "local Kafka %s starting on %s (logs in %s)", self.version, self.bootstrap, self.workdir
        )
        self._wait_ready(timeout)

    def kill(self) -> None:
        """Stop the broker abruptly but keep its data, for outage tests."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self, timeout: float = 120.0) -> None:
        """Start again on the same ports with the same data after `kill`."""
        self.kill()
        self._launch(timeout)

    def freeze(self) -> None:
        """SIGSTOP the broker JVM: its sockets stay open but nothing answers, as in a
        long GC pause or a stalled VM, which looks different to clients from a crash."""
        import signal

        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after `freeze`; harmless when the broker is not frozen."""
        import signal

        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient  # slow import, only when starting

        deadline = time.monotonic() + timeout
        # The port first, so the client does not log a refused connection every 50 ms.
        while not self._port_open():
            if self._process is not None and self._process.poll() is not None:
                raise DelayServiceError(f"the local broker exited; see {self.workdir}/server.log")
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while time.monotonic() < deadline:
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # noqa: S112  # not up yet: try again until the deadline
                continue
        raise DelayServiceError(f"the local broker did not become ready in {timeout:.0f}s")

    def _port_open(self) -> bool:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
