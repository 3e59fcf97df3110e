"""The embedded Apache Kafka, for the demo, the tests and local work: one JVM that is a KRaft broker and
controller, on loopback, with its log directory under a home folder so that topics survive a stop (or a
crash) and come back with the next start. The tests also start several such nodes as one cluster (a quorum
of combined broker+controller voters, `launch_node`), each with a home of its own.

A home holds `server.properties` (written at every start), `data/` (the log directory, formatted once) and
`broker.log`. The client listener may be advertised on another port (a fault-injecting proxy in front of it);
the broker's own traffic then goes through an internal listener of its own, never through the proxy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pin_identity.adapters.file_locks import exclusive
from pin_identity.adapters.kafka.distribution import KAFKA_VERSION, KafkaRuntime, cache_root, kafka_runtime
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.processes import command_line_holds

HOST = "127.0.0.1"
# A cold JVM on a busy 2-core machine starts well within this (BENCHMARKS.md, "The embedded broker").
START_TIMEOUT_S = 90.0
# A clean stop writes its partitions' checkpoints; a stop that takes longer is ended with SIGKILL, which
# the next start recovers from (Kafka's log recovery), so nothing acknowledged is lost either way.
STOP_TIMEOUT_S = 30.0
HEAP_MB = 512
JVM_OPTIONS_VARIABLE = "PIN_IDENTITY_EMBEDDED_KAFKA_JVM_OPTIONS"
_JVM_OPTIONS = (
    "-Xms128m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)


@dataclass(frozen=True)
class BrokerProcess:
    pid: int
    port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_open(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class QuorumNode:
    """One combined broker+controller of a KRaft quorum and its loopback ports (kept across its restarts)."""

    node_id: int
    port: int  # clients
    internal_port: int  # the brokers' replication
    controller_port: int  # the quorum's votes

    @classmethod
    def on_free_ports(cls, node_id: int, port: int | None = None) -> QuorumNode:
        return cls(node_id, port or free_port(), free_port(), free_port())


def broker_properties(
    log_dir: Path,
    node: QuorumNode,
    voters: Sequence[QuorumNode] = (),
    *,
    advertised_port: int | None = None,
) -> dict[str, str]:
    """A KRaft node sized for 2 cores and a small heap; alone (no `voters`), a single-node cluster. Internal
    topics get one replica and one partition (their defaults, 3 and 50, cannot be met by one broker or cost
    a first group seconds); a cluster of several nodes raises their replication with `overrides`."""
    port, internal_port = node.port, node.internal_port
    return {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        # Static voters: the formatted log directory then records no host or port, so it can be copied and
        # restarted on any ports.
        "controller.quorum.voters": ",".join(
            f"{voter.node_id}@{HOST}:{voter.controller_port}" for voter in (voters or (node,))
        ),
        "listeners": f"CLIENT://{HOST}:{port},INTERNAL://{HOST}:{internal_port},"
        f"CONTROLLER://{HOST}:{node.controller_port}",
        "advertised.listeners": f"CLIENT://{HOST}:{advertised_port or port},INTERNAL://{HOST}:{internal_port}",
        "listener.security.protocol.map": "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "INTERNAL",
        "log.dirs": str(log_dir),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "1",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Topics are created by `kafka ensure-topics` (and the relay) with their layout and compaction, as on
        # a production cluster that forbids creation by a metadata request.
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "group.coordinator.threads": "1",
        "log.cleaner.threads": "1",
        # 128 MiB by default, held on the heap from the start; KafkaConfig wants more than 1 MiB per thread.
        "log.cleaner.dedupe.buffer.size": "2097152",
        # The cleaner looks for dirty logs every 0.5 s instead of 15 s: compaction shows within seconds.
        "log.cleaner.backoff.ms": "500",
        "log.segment.delete.delay.ms": "1000",
    }


def start_broker(
    home: Path,
    port: int | None = None,
    *,
    advertised_port: int | None = None,
    overrides: Mapping[str, str] | None = None,
) -> BrokerProcess:
    """Start a broker whose files live in `home` (formatted on first use, reused after) and wait until it
    serves clients. `overrides` are extra broker properties (a test's compaction or timeouts)."""
    node = QuorumNode.on_free_ports(1, port)
    process = launch_node(home, node, advertised_port=advertised_port, overrides=overrides)
    wait_node_ready(process, node.port, home / "broker.log")
    return BrokerProcess(process.pid, node.port)


def launch_node(
    home: Path,
    node: QuorumNode,
    voters: Sequence[QuorumNode] = (),
    *,
    advertised_port: int | None = None,
    overrides: Mapping[str, str] | None = None,
    heap_mb: int = HEAP_MB,
) -> subprocess.Popen[bytes]:
    """Start one node of a quorum of `voters` (alone by default) without waiting: a node of several serves
    clients only once a majority of the voters runs, so they are all launched before any is waited for."""
    runtime = kafka_runtime()
    archive = class_archive_path(runtime)
    sharing = [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []
    properties = broker_properties(home / "data", node, voters, advertised_port=advertised_port)
    jvm_options = [f"-Xmx{heap_mb}m", *sharing, *extra_jvm_options()]
    return _launch_with(runtime, home, node, {**properties, **(overrides or {})}, jvm_options)


def extra_jvm_options() -> list[str]:
    """PIN_IDENTITY_EMBEDDED_KAFKA_JVM_OPTIONS, added to every embedded node's JVM. The test suite sets
    `-XX:TieredStopAtLevel=1`: its brokers live seconds to minutes, and compiling with C1 alone costs them a
    fifth less CPU on a 2-core machine, at a lower peak throughput that benchmarks must not have."""
    return shlex.split(os.environ.get(JVM_OPTIONS_VARIABLE, ""))


def prepare_starts(runtime: KafkaRuntime) -> None:
    """Done once per cache (`embedded fetch`), so that every later start is quicker: a formatted log
    directory to copy, and an archive of the classes a broker loads (Class Data Sharing: the JVM maps them
    instead of loading and verifying each; a broker then serves in about 2.3 s instead of 4-5 s on an idle
    2-core machine). A start without the archive (another Java, a cache filled by a first start) works the
    same, only slower."""
    _formatted_template(runtime)
    archive = class_archive_path(runtime)
    with exclusive(archive.with_suffix(".lock")):
        if not archive.exists():
            _archive_classes(runtime, archive)


def _archive_classes(runtime: KafkaRuntime, archive: Path) -> None:
    """A broker started and stopped cleanly: at its exit the JVM writes the classes it loaded."""
    with tempfile.TemporaryDirectory(dir=archive.parent, prefix="archiving-") as staging:
        home, node = Path(staging), QuorumNode.on_free_ports(1)
        written = home / "classes.jsa"
        jvm_options = [f"-Xmx{HEAP_MB}m", f"-XX:ArchiveClassesAtExit={written}"]
        process = _launch_with(runtime, home, node, broker_properties(home / "data", node), jvm_options)
        wait_node_ready(process, node.port, home / "broker.log")
        stop_broker(process.pid)
        if not written.exists():
            raise RuntimeError(f"the embedded Apache Kafka wrote no class archive; see {home / 'broker.log'}")
        written.rename(archive)


def class_archive_path(runtime: KafkaRuntime) -> Path:
    """One archive per Java build: the JVM refuses an archive another build wrote."""
    java = runtime.java.resolve()
    build = hashlib.sha256(f"{java}:{java.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / f"kafka-{runtime.version}" / f"classes-{build}.jsa"


def _launch_with(
    runtime: KafkaRuntime,
    home: Path,
    node: QuorumNode,
    properties: Mapping[str, str],
    jvm_options: Sequence[str],
) -> subprocess.Popen[bytes]:
    """A node's home prepared (its log directory formatted once, its properties written) and its JVM
    started."""
    home.mkdir(parents=True, exist_ok=True)
    _format_once(runtime, home / "data", node.node_id)
    config = home / "server.properties"
    config.write_text(_render(properties))
    # lz4-java unpacks its native library into the JVM's temporary directory at every start, and a killed
    # broker never deletes it: kept in the node's home, not left by the hundred in /tmp.
    scratch = home / "tmp"
    scratch.mkdir(exist_ok=True)
    return _launch(runtime, config, home / "broker.log", [*jvm_options, f"-Djava.io.tmpdir={scratch}"])


def _render(properties: Mapping[str, str]) -> str:
    return "".join(f"{name}={value}\n" for name, value in properties.items())


def _launch(
    runtime: KafkaRuntime, config: Path, log_path: Path, jvm_options: Sequence[str]
) -> subprocess.Popen[bytes]:
    command = [
        str(runtime.java), *_JVM_OPTIONS, *jvm_options,
        f"-Dlog4j2.configurationFile={runtime.config_file('log4j2.properties')}",
        "-cp", runtime.classpath, "kafka.Kafka", str(config),
    ]  # fmt: skip
    with log_path.open("ab") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the command that started it; `embedded stop` ends it
        )


def wait_node_ready(process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
    """Kafka opens its client port only once the broker is unfenced and serving (SocketServer defers the
    bind for exactly that reason), so an accepted connection means ready."""
    deadline = SYSTEM_CLOCK.monotonic() + START_TIMEOUT_S
    while not port_open(port):
        if process.poll() is not None:
            raise RuntimeError(f"the embedded Apache Kafka exited with {process.returncode}; see {log_path}")
        if SYSTEM_CLOCK.monotonic() > deadline:
            kill_broker(process.pid)
            raise RuntimeError(
                f"the embedded Apache Kafka did not start in {START_TIMEOUT_S:g} s; see {log_path}"
            )
        time.sleep(0.05)


def _format_once(runtime: KafkaRuntime, log_dir: Path, node_id: int = 1) -> None:
    """A new log directory is a copy of one formatted in the cache (formatting costs a JVM start); one
    that holds `meta.properties` is already formatted and kept as it is. Every copy has the template's
    cluster id, so the nodes of a quorum agree on it; each gets its own node id and directory id."""
    if (log_dir / "meta.properties").exists():
        return
    template = _formatted_template(runtime)
    shutil.rmtree(log_dir, ignore_errors=True)
    shutil.copytree(template, log_dir)
    if node_id != 1:
        _renumber(log_dir / "meta.properties", node_id)


def _renumber(meta: Path, node_id: int) -> None:
    """What formatting for `node_id` would have written: the node id, and a directory id of its own (the
    controller tells the log directories of a cluster apart by it)."""
    fresh = {"node.id": str(node_id), "directory.id": _random_uuid()}
    lines = meta.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.split("=", 1)[0] not in fresh]
    meta.write_text("\n".join([*kept, *(f"{name}={value}" for name, value in fresh.items())]) + "\n")


def _formatted_template(runtime: KafkaRuntime) -> Path:
    folder = cache_root() / f"kafka-{runtime.version}"
    template = folder / "formatted"
    with exclusive(folder / ".format-lock"):
        if (template / "meta.properties").exists():
            return template
        staging = folder / "formatting"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _storage_format(runtime, staging)
        shutil.rmtree(template, ignore_errors=True)
        (staging / "data").rename(template)
        shutil.rmtree(staging)
    return template


def _storage_format(runtime: KafkaRuntime, staging: Path) -> None:
    config = staging / "server.properties"
    config.write_text(_render(broker_properties(staging / "data", QuorumNode.on_free_ports(1))))
    command = [
        str(runtime.java), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        f"-Dlog4j2.configurationFile={runtime.config_file('tools-log4j2.properties')}",
        "-cp", runtime.classpath, "kafka.tools.StorageTool",
        "format", "--ignore-formatted", "--cluster-id", _random_uuid(), "--config", str(config),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(
            f"formatting the embedded Apache Kafka failed: {last[-1] if last else done.returncode}"
        )


def _random_uuid() -> str:
    """What `kafka-storage.sh random-uuid` prints: 16 random bytes in URL-safe base64, not starting with a
    dash (the tool would read it as an option)."""
    import base64
    import uuid

    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


def stop_broker(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """A clean stop (SIGTERM: Kafka's controlled shutdown), SIGKILL after `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = SYSTEM_CLOCK.monotonic() + timeout_s
        while _lives(pid) and SYSTEM_CLOCK.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _lives(pid):
            os.kill(pid, signal.SIGKILL)
    _reap(pid)


def kill_broker(pid: int) -> None:
    """A crash: SIGKILL, no shutdown of any kind; the next start on the same home recovers the log."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = SYSTEM_CLOCK.monotonic() + 10
    while _lives(pid) and SYSTEM_CLOCK.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.02)
    _reap(pid)


def is_broker(pid: int) -> bool:
    """A live embedded broker (a zombie has no command line left)."""
    return command_line_holds(pid, b"kafka.Kafka")


def _lives(pid: int) -> bool:
    """The broker, or what is left of it still running: once the JVM's main thread has ended, its command line
    reads empty and its main thread shows as a zombie, while its other threads may run the shutdown (the
    controller's, the log's) for seconds more."""
    if is_broker(pid):
        return True
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return fields.get("State", "").strip().startswith("Z") and int(fields.get("Threads", "1")) > 1


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


# ---------------------------------------------------------------- the data dir's broker (embedded info, stop)


def _home(data_dir: Path) -> Path:
    return data_dir.resolve() / "kafka"


def ensure_embedded_kafka(data_dir: Path) -> str:
    """Reuse the broker recorded under the data dir if it still runs, else start it (on its last port when
    that is free, so an address an operator noted stays valid)."""
    home = _home(data_dir)
    with exclusive(home / ".lock"):
        state = read_broker_state(data_dir)
        if state is not None and is_broker(state["pid"]) and port_open(state["port"]):
            return BrokerProcess(state["pid"], state["port"]).bootstrap_servers
        last_port = state["port"] if state is not None else None
        port = last_port if last_port and not port_open(last_port) else free_port()
        broker = start_broker(home, port)
        state_file = home / "broker.json"
        document = {"pid": broker.pid, "port": broker.port, "version": KAFKA_VERSION}
        state_file.write_text(json.dumps(document))
        return broker.bootstrap_servers


def read_broker_state(data_dir: Path) -> dict[str, int] | None:
    """The last start recorded under the data dir: pid and port (None when never started here)."""
    try:
        state = json.loads((_home(data_dir) / "broker.json").read_text(encoding="utf-8"))
        return {"pid": int(state["pid"]), "port": int(state["port"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stop_embedded_kafka(data_dir: Path) -> bool:
    """Stop the data dir's broker if it runs (its topics stay on disk); True when one was stopped."""
    home = _home(data_dir)
    with exclusive(home / ".lock"):
        state = read_broker_state(data_dir)
        if state is None or not is_broker(state["pid"]):
            return False
        stop_broker(state["pid"])
        return True
