"""`pin-identity roles ...`, `fanout ...`, `maintenance ...`: the operator's commands outside the import."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated
from uuid import UUID

import typer

from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.entrypoints import cli_output as out
from pin_identity.entrypoints.cli_common import JsonOption, command_group, container_from_env, operator
from pin_identity.operations.fanout_admin import PastCursor

roles_app = command_group("Role definitions.")
fanout_app = command_group("The access fan-out queue.")
maintenance_app = command_group("Retention.")


_ROLE_COLUMNS = (
    out.Column("role id", whole=True),
    out.Column("code", whole=True),
    out.Column("name"),
    out.Column("company"),
    out.Column("status", whole=True),
    out.Column("version"),
    out.Column("holders"),
    out.Column("permissions"),
)


@roles_app.command("list")
def roles_list(
    code: Annotated[str | None, typer.Option("--code", help="Only roles with this code.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most this many.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """Roles with their permissions and size (holders): system roles first, then by company and code."""
    with container_from_env() as container:
        roles = container.use_cases.role_admin.roles(code=code, limit=limit)
    if as_json:
        out.print_json(roles)
        return
    rows = [
        (
            str(role.role_id),
            role.code,
            role.name,
            role.company_name or (str(role.company_id) if role.company_id else "system role"),
            role.status.value,
            out.text(role.version),
            out.text(role.holders),
            ", ".join(role.permissions) or "-",
        )
        for role in roles
    ]
    out.print_rows(_ROLE_COLUMNS, rows, title="roles", empty="no role found", console=out.stdout())


@roles_app.command("show")
def roles_show(
    role_id: Annotated[UUID, typer.Argument(help="The role.")],
    as_json: JsonOption = False,
) -> None:
    """One role with its permissions and size (holders)."""
    with container_from_env() as container:
        role = container.use_cases.role_admin.role(role_id)
    if as_json:
        out.print_json(role)
        return
    fields = [
        ("role id", role.role_id),
        ("code", role.code),
        ("name", role.name),
        ("company", role.company_name or role.company_id or "system role"),
        ("status", role.status.value),
        ("version", role.version),
        ("holders", role.holders),
        ("permissions", ", ".join(role.permissions) or None),
    ]
    out.print_fields(fields, title=f"role {role.code}", console=out.stdout())


@roles_app.command("set-permissions")
def roles_set_permissions(
    role_id: Annotated[UUID, typer.Argument(help="The role whose permission set is replaced.")],
    codes: Annotated[list[str], typer.Argument(help="The complete new permission set.")],
    as_json: JsonOption = False,
) -> None:
    """Replace a role's permissions, bump its version, notify its users inline or via the fan-out queue."""
    with container_from_env() as container:
        change = container.use_cases.role_admin.set_permissions(role_id, codes, who=operator())
    if as_json:
        out.print_json(change)
        return
    fields = [
        ("role id", change.role_id),
        ("role version", change.role_version),
        ("path", change.path.value),
        ("users notified inline", change.users_notified_inline),
        ("fan-out task", change.task_id),
    ]
    out.print_fields(fields, title="permissions replaced", console=out.stdout())


_TASK_COLUMNS = (
    out.Column("task id", whole=True),
    out.Column("role id", whole=True),
    out.Column("version"),
    out.Column("status", whole=True),
    out.Column("users done"),
    out.Column("attempts"),
    out.Column("created"),
    out.Column("last error"),
)


@fanout_app.command("list")
def fanout_list(
    status: Annotated[
        FanOutTaskStatus | None, typer.Option("--status", help="Only tasks in this status.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """The newest fan-out tasks first."""
    with container_from_env() as container:
        tasks = container.use_cases.fanout_admin.tasks(status, limit)
    if as_json:
        out.print_json(tasks)
        return
    rows = [
        (
            str(task.task_id),
            str(task.role_id),
            out.text(task.role_version),
            task.status.value,
            out.text(task.processed_count),
            out.text(task.attempt_count),
            out.when(task.created_at),
            task.last_error or "",
        )
        for task in tasks
    ]
    out.print_rows(
        _TASK_COLUMNS,
        rows,
        title="fan-out tasks, newest first",
        empty="no fan-out task",
        console=out.stdout(),
    )


@fanout_app.command("replay")
def fanout_replay(task_id: Annotated[UUID, typer.Argument(help="A Failed task.")]) -> None:
    """Runbook: after fixing the cause, a Failed task goes back to Pending (AttemptCount = 0)."""
    with container_from_env() as container:
        container.use_cases.fanout_admin.replay(task_id, who=operator())
    typer.echo(f"task {task_id} is Pending again")


@fanout_app.command("discard")
def fanout_discard(task_id: Annotated[UUID, typer.Argument(help="A Failed task.")]) -> None:
    """Runbook: a Failed task that is not to be replayed (a newer task of its role notified every holder, or
    they were re-announced) is deleted; `maintenance prune` never deletes a Failed task."""
    with container_from_env() as container:
        discarded = container.use_cases.fanout_admin.discard(task_id, who=operator())
    task = discarded.task
    typer.echo(
        f"task {task_id} discarded: role {task.role_id} version {task.role_version},"
        f" {task.processed_count} users notified before it failed; {discarded.detail}"
    )
    if discarded.past_cursor is PastCursor.NEVER_TOLD:
        typer.echo(f"warning: {discarded.detail}", err=True)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def _duration(spelled: str) -> timedelta:
    """`90d`, `12h`, `30m`, `3600s`."""
    unit = _DURATION_UNITS.get(spelled[-1:].lower())
    if unit is None or not spelled[:-1].isdigit():
        raise typer.BadParameter(
            f"{spelled!r} is not a duration like 30d, 12h, 45m or 90s", param_hint="--older-than"
        )
    return timedelta(seconds=int(spelled[:-1]) * unit)


@maintenance_app.command("prune")
def maintenance_prune(
    older_than: Annotated[str, typer.Option("--older-than", help="Age cutoff: 30d, 12h, 45m, 90s.")],
    as_json: JsonOption = False,
) -> None:
    """Delete Completed fan-out tasks, finished import runs with their pages, and quarantine payloads older
    than the cutoff (PII retention). Failed fan-out tasks stay until replayed or discarded."""
    age = _duration(older_than)
    with container_from_env() as container:
        pruned = container.use_cases.retention.prune(age, who=operator())
    if as_json:
        out.print_json(pruned)
        return
    fields = [
        ("fan-out tasks deleted", pruned.fanout_tasks),
        ("import runs deleted", pruned.import_runs),
        ("quarantine payloads emptied", pruned.quarantine_payloads),
    ]
    out.print_fields(fields, title=f"pruned what is older than {older_than}", console=out.stdout())
