"""The composition root: settings in, connected adapters, jobs and use cases out. The wiring only; each part
has its home beside this module:

- `connections`: the database's pool and the broker's client configuration, with their start-up checks;
- `stores`: the PostgreSQL adapters on that pool;
- `jobs`: what `worker --jobs` runs; `use_cases`: what the CLI and the HTTP API call;
- `privileges`: the Kafka ACLs and database grants of each job; `embedded_servers`: the embedded servers;
- `failures`: the one line, naming a variable, that a failure of either server becomes.

A command builds one `Container`, touches only what it needs (each part is made on first use), and closes it.
A test builds the part it tests (`Connections(settings)`, then `Stores(...)`, ...) or the whole."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition.connections import Connections
from pin_identity.composition.jobs import Jobs
from pin_identity.composition.stores import Stores
from pin_identity.composition.use_cases import UseCases
from pin_identity.config import Settings
from pin_identity.domain.clock import Clock


@dataclass
class Container:
    settings: Settings
    # The one clock of the process: every job and use case reads the time from it (a test passes its own).
    clock: Clock = SYSTEM_CLOCK
    connections: Connections = field(init=False)

    def __post_init__(self) -> None:
        self.connections = Connections(self.settings)

    @cached_property
    def stores(self) -> Stores:
        return Stores(self.connections)

    @cached_property
    def jobs(self) -> Jobs:
        return Jobs(self.connections, self.stores, self.clock)

    @cached_property
    def use_cases(self) -> UseCases:
        return UseCases(self.connections, self.stores, self.jobs, self.clock)

    def close(self) -> None:
        """Close what was opened (producers, sessions, the pool), last opened first."""
        self.connections.close()
