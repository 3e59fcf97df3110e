"""Stopping an embedded broker returns once its process is gone, not once the JVM's main thread has ended:
a Kafka node's shutdown hook can run for seconds after that, its command line already empty, and a node
started again meanwhile would meet the old one still running."""

from __future__ import annotations

import subprocess
import sys

from pin_identity.adapters.kafka.embedded_kafka import stop_broker

# A stand-in for the JVM: it outlives SIGTERM's default, its main thread ends at once, and another thread
# ends the process a while later. "kafka.Kafka" on its command line makes it a broker to stop_broker.
LINGERING = """
import ctypes, os, signal, sys, threading, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
def shutdown():
    time.sleep(float(sys.argv[1]))
    os._exit(0)
threading.Thread(target=shutdown).start()
sys.stdout.write("started\\n")
sys.stdout.flush()
ctypes.CDLL(None).pthread_exit(None)
"""


def test_stopping_a_broker_waits_until_its_last_thread_is_gone() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", LINGERING, "2", "kafka.Kafka"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "started\n"
        stop_broker(process.pid, timeout_s=30)
        assert process.poll() is not None, "stop_broker returned while the process still ran"
    finally:
        process.kill()
        process.wait()
