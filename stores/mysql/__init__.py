"""The MySQL (MariaDB) master/replica store: `mysql://user:pass@master:3306/db?replica=host:3306`.

`MySQLStore` is what `open_store` returns for mysql:// URIs; `init_schema` is what
`kiteq-admin store init` runs; `check_schema` tells whether a store could open a
database. See docs/mysql-store.md.
"""

from stores.mysql.schema import SCHEMA_VERSION, SchemaInfo, check_schema, init_schema
from stores.mysql.store import MySQLStore
from stores.mysql.uri import MySQLConfig, parse_uri

__all__ = [
    "SCHEMA_VERSION",
    "MySQLConfig",
    "MySQLStore",
    "SchemaInfo",
    "check_schema",
    "init_schema",
    "parse_uri",
]
