"""PostgreSQL adapter: pool, SQL catalogue, repositories, migrations, embedded server."""
