"""The Apache Kafka release the embedded broker runs: its jars, fetched once from Maven Central into a cache
outside the repository, and the Java that runs them.

`pin-identity embedded fetch` (run by `make demo` and `make test`) fills the cache; the first start of an
embedded broker fills it too when that was skipped. The cache is `$XDG_CACHE_HOME/pin-identity` (else
`~/.cache/pin-identity`): one folder per Kafka version, never two versions on one classpath.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pin_identity.adapters.file_locks import exclusive

# 4.2.1: the newest release whose closure Maven Central serves whole here, built with log4j 2.25.3 (pinned in
# runtime/pom.xml). Not 4.0.0: it dropped JoinGroup v0/v1, which librdkafka < 2.11 needs for consumer groups.
KAFKA_VERSION = "4.2.1"
MINIMUM_JAVA = 17
_RUNTIME = resources.files("pin_identity.adapters.kafka") / "runtime"
# A fetch downloads about 45 jars (43 MB); on a slow mirror that takes minutes, not hours.
_FETCH_TIMEOUT_S = 900


class KafkaRuntimeUnavailableError(Exception):
    """Java 17+ or Maven is missing, or Maven could not fetch the release; the message says which, in one
    line."""


@dataclass(frozen=True)
class KafkaRuntime:
    """What starting a broker needs: a Java of 17 or newer and the release's jars."""

    java: Path
    lib: Path
    version: str = KAFKA_VERSION

    @property
    def classpath(self) -> str:
        return f"{self.lib}/*"

    def config_file(self, name: str) -> Path:
        """One of the log4j2 files shipped with the package (they live next to the pom)."""
        return Path(str(_RUNTIME / name))


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pin-identity"


def kafka_runtime(*, fetch: bool = True) -> KafkaRuntime:
    """The runtime, fetching the jars first if they are not cached (and `fetch` allows it)."""
    java = find_java()
    folder = cache_root() / f"kafka-{KAFKA_VERSION}"
    lib = folder / "lib"
    if not (folder / "complete").exists():
        if not fetch:
            raise KafkaRuntimeUnavailableError(
                f"Apache Kafka {KAFKA_VERSION} is not fetched yet (pin-identity embedded fetch)"
            )
        _fetch(folder)
    return KafkaRuntime(java, lib)


def find_java() -> Path:
    """`$JAVA_HOME/bin/java` when JAVA_HOME is set, else `java` on PATH; 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    candidate = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not candidate or not Path(candidate).exists():
        raise KafkaRuntimeUnavailableError(
            f"no Java found (JAVA_HOME or java on PATH); the embedded Apache Kafka needs Java {MINIMUM_JAVA}+"
        )
    major = java_major_version(Path(candidate))
    if major < MINIMUM_JAVA:
        raise KafkaRuntimeUnavailableError(
            f"{candidate} is Java {major}; the embedded Apache Kafka needs Java {MINIMUM_JAVA}+"
        )
    return Path(candidate)


def java_major_version(java: Path) -> int:
    """From `java -version` (it prints to stderr): `version "17.0.15"` -> 17, `version "1.8.0_392"` -> 8."""
    shown = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', shown.stderr + shown.stdout)
    if found is None:
        raise KafkaRuntimeUnavailableError(f"{java} -version printed no version")
    first, second = int(found.group(1)), int(found.group(2) or 0)
    return second if first == 1 else first


def _fetch(folder: Path) -> None:
    """Copy the release's runtime closure into `folder/lib` with Maven, under a lock (two commands starting
    at once fetch once), into a staging folder renamed at the end (a cut fetch leaves no half a classpath)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaRuntimeUnavailableError(
            f"Maven (mvn) is not on PATH; it fetches Apache Kafka {KAFKA_VERSION} for the embedded broker"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with exclusive(folder / ".lock"):
        if (folder / "complete").exists():
            return
        with tempfile.TemporaryDirectory(dir=folder, prefix="fetching-") as staging:
            _copy_dependencies(mvn, Path(staging))
            shutil.rmtree(folder / "lib", ignore_errors=True)
            (Path(staging) / "lib").rename(folder / "lib")
        (folder / "complete").write_text(f"{KAFKA_VERSION}\n")


def _copy_dependencies(mvn: str, staging: Path) -> None:
    pom = staging / "pom.xml"
    pom.write_bytes((_RUNTIME / "pom.xml").read_bytes())
    command = [
        mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
        f"-DoutputDirectory={staging / 'lib'}", "-DincludeScope=runtime",
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_FETCH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise KafkaRuntimeUnavailableError(
            f"Maven did not fetch Apache Kafka {KAFKA_VERSION} in {_FETCH_TIMEOUT_S} s"
        ) from None
    if done.returncode != 0:
        raise KafkaRuntimeUnavailableError(
            f"Maven could not fetch Apache Kafka {KAFKA_VERSION}: {_maven_error(done.stdout + done.stderr)}"
        )


def _maven_error(output: str) -> str:
    """Maven's first `[ERROR]` line, the one that names what failed (artifact, repository, reason)."""
    errors = [line.removeprefix("[ERROR]").strip() for line in output.splitlines() if "[ERROR]" in line]
    return next((line for line in errors if line), output.strip().splitlines()[-1] if output.strip() else "")
