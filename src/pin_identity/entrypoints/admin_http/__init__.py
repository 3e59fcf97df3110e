"""`pin-identity serve`: the platform-admin HTTP API of CONTRACTS section 6, with /metrics, /healthz, /readyz.

Every `/admin/` route needs `Authorization: Bearer <token>` of a known operator (tokens) whose role permits
the method, checked before the body is read, and takes a body of at most 1 MiB (gate); every error is
RFC 9457 problem+json with a `code`, decided by one table (problems). A route parses, calls the operator
service (operations/), and answers the document it returns (or one of entrypoints.documents); the service
writes the action's `admin-action` audit line, naming the operator.

One module per resource:

| routes                              | module          |
|-------------------------------------|-----------------|
| /admin/v1/talent-import/...         | talent_import   |
| /admin/v1/talent-sync/...           | talent_sync     |
| /admin/v1/access-fanout/...         | fanout          |
| /admin/v1/roles/...                 | roles           |
| /admin/v1/whoami                    | operators       |
| /admin/v1/health/summary            | health          |
| /admin/v1/access/users/{userId}     | access          |
| /metrics, /healthz, /readyz         | probes          |
| /ui/...                             | console         |

What they share: routing (dependencies, path parameters), problems, gate, tokens, gauges; app assembles them.
"""

from pin_identity.entrypoints.admin_http.app import create_app, serve_admin_api

__all__ = ["create_app", "serve_admin_api"]
